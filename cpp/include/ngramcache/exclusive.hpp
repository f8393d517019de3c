// Exclusive<T>: an object that one thread at a time may use, and that says so instead of
// racing when a second thread tries.
//
// The drafters keep per-sequence state without a lock of their own (a step takes
// microseconds, a lock would cost as much). Python callers share a drafter between threads
// by mistake, and a long call (a whole replay) runs with the interpreter's lock released,
// so another thread can call in meanwhile: that call must fail cleanly, not corrupt the
// drafter. A Claim marks the object busy for one call; a second claim, or use() during
// one, throws InUse. Two claims cost one atomic exchange each; use() one atomic load.
#pragma once

#include <atomic>
#include <stdexcept>
#include <utility>

namespace ngramcache {

struct InUse : std::runtime_error {
    InUse() : std::runtime_error("this drafter is in use by another thread") {}
};

template <class T>
class Exclusive {
public:
    template <class... A>
    explicit Exclusive(A&&... a) : value_(std::forward<A>(a)...) {}
    Exclusive(const Exclusive&) = delete;
    Exclusive& operator=(const Exclusive&) = delete;

    // For a short call that cannot overlap one of its own thread (the caller holds a lock
    // that every claimant takes first, such as Python's): refused while a claim is held.
    T& use() {
        if (busy_.load(std::memory_order_acquire)) throw InUse();
        return value_;
    }
    const T& use() const {
        if (busy_.load(std::memory_order_acquire)) throw InUse();
        return value_;
    }

    // The object for as long as the claim lives; only one claim at a time.
    class Claim {
    public:
        explicit Claim(Exclusive& e) : owner_(e) {
            bool expected = false;
            if (!owner_.busy_.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) throw InUse();
        }
        ~Claim() { owner_.busy_.store(false, std::memory_order_release); }
        Claim(const Claim&) = delete;
        Claim& operator=(const Claim&) = delete;
        T& operator*() const { return owner_.value_; }
        T* operator->() const { return &owner_.value_; }

    private:
        Exclusive& owner_;
    };

    bool busy() const { return busy_.load(std::memory_order_acquire); }

private:
    T value_;
    std::atomic<bool> busy_{false};
};

}  // namespace ngramcache
