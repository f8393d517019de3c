// Building blocks of the sort-based builds: big zero-filled arrays whose pages the kernel
// can take back while a build runs, and a sorter for lists of distinct ids.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "ngst_format.hpp"

namespace ngramcache {
namespace ngst {

// Zero-filled anonymous memory for the big build arrays: the kernel zeroes pages as they
// are first touched, so there is no separate memset pass over hundreds of MB.
inline uint8_t* map_zeroed(uint64_t size) {
    const uint64_t sz = size == 0 ? kAlign : size;
#if defined(MADV_HUGEPAGE)
    // Huge pages where the kernel allows them: every page gets written, and 2 MiB pages
    // take 1/512 of the faults (the zeroing dominates what is left).
    void* p = ::mmap(nullptr, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    if (sz >= (uint64_t(4) << 20)) ::madvise(p, sz, MADV_HUGEPAGE);
#else
    int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_POPULATE
    flags |= MAP_POPULATE;  // every page gets written: faulting them in one go is cheaper
#endif
    void* p = ::mmap(nullptr, sz, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
#endif
    return static_cast<uint8_t*>(p);
}

inline std::shared_ptr<uint8_t> alloc_image(uint64_t size) {
    const uint64_t sz = size == 0 ? kAlign : size;
    uint8_t* p = map_zeroed(sz);
    return std::shared_ptr<uint8_t>(p, [sz](uint8_t* q) { ::munmap(q, sz); });
}

// A fixed-size array of trivially copyable T in map_zeroed memory.
template <class T>
class BigArray {
public:
    explicit BigArray(size_t n) : n_(n), p_(reinterpret_cast<T*>(map_zeroed(bytes()))) {}
    BigArray(const BigArray&) = delete;
    BigArray& operator=(const BigArray&) = delete;
    ~BigArray() { ::munmap(p_, bytes()); }
    T* data() { return p_; }
    size_t size() const { return n_; }
    T& operator[](size_t i) { return p_[i]; }
    const T& operator[](size_t i) const { return p_[i]; }
    // Gives the whole pages of elements [from, to) back to the kernel: their memory is
    // freed, and they read as zeros if touched again.
    void discard(size_t from, size_t to) {
        const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
        const uint64_t lo = (uint64_t(from) * sizeof(T) + page - 1) / page * page;
        const uint64_t hi = to == n_ ? bytes() : uint64_t(to) * sizeof(T) / page * page;
        if (lo < hi) ::madvise(reinterpret_cast<uint8_t*>(p_) + lo, hi - lo, MADV_DONTNEED);
    }

private:
    uint64_t bytes() const { return n_ == 0 ? kAlign : uint64_t(n_) * sizeof(T); }
    size_t n_;
    T* p_;
};

// Sorts lists of distinct ids below a bound in O(length + id span / 4096): a two-level
// bitmap (one bit per id, one summary bit per 64-id word) that is set, then read back in
// order and cleared. Short lists use an insertion sort instead.
class DistinctSorter {
public:
    explicit DistinctSorter(uint64_t n_ids) : bits_((n_ids + 63) / 64, 0), top_((bits_.size() + 63) / 64, 0) {}
    void sort(std::vector<uint32_t>& v) {
        const size_t n = v.size();
        if (n <= 24) {
            for (size_t i = 1; i < n; ++i) {
                const uint32_t x = v[i];
                size_t j = i;
                for (; j > 0 && v[j - 1] > x; --j) v[j] = v[j - 1];
                v[j] = x;
            }
            return;
        }
        uint32_t lo = UINT32_MAX;
        for (uint32_t x : v) {
            bits_[x >> 6] |= uint64_t(1) << (x & 63);
            top_[x >> 12] |= uint64_t(1) << ((x >> 6) & 63);
            lo = std::min(lo, x);
        }
        size_t k = 0;
        for (size_t t = lo >> 12; k < n; ++t) {
            for (uint64_t tw = top_[t]; tw != 0; tw &= tw - 1) {
                const size_t wi = t * 64 + static_cast<size_t>(__builtin_ctzll(tw));
                for (uint64_t bw = bits_[wi]; bw != 0; bw &= bw - 1)
                    v[k++] = static_cast<uint32_t>(wi * 64 + static_cast<size_t>(__builtin_ctzll(bw)));
                bits_[wi] = 0;
            }
            top_[t] = 0;
        }
    }

private:
    std::vector<uint64_t> bits_, top_;
};

}  // namespace ngst
}  // namespace ngramcache
