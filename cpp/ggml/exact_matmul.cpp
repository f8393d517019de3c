// Exact batched matrix products for llama.cpp's CPU backend, as a ggml "ACCEL" backend.
//
// Why: on the exact build (no llamafile kernels, no repacking), every row of a verified draft
// is computed by ggml's one-token dot product, one weight row and one token at a time. Each
// weight block is decoded again for every token of the batch, so verifying 8 drafted tokens
// costs nearly 8 single-token products. Here each weight block is decoded once and multiplied
// with up to four tokens, while each token's sum runs through exactly the operations of
// ggml's one-token kernel (its AVX2 code), in the same order: the same integer sums per block
// and lane (integers: exact whatever their order), the same float scales, the same fused
// multiply-adds into eight lanes, the same horizontal sum. A batch's rows are therefore bit
// for bit the rows a single token gets; tests/test_exact_matmul.py compares them with ggml's
// own kernel. The kernels (kernels.inc) are compiled twice: for AVX2, and for AVX-512 VNNI,
// whose one-instruction byte products give the same integers.
//
// How it joins llama.cpp: ggml's scheduler offers each matrix product to the registered
// backends in order (GPUs, then accelerators, then the CPU) and takes the first that accepts
// the weights' buffer and the operation. This backend accepts host buffers and products of
// Q8_0, Q5_0, Q4_0, Q4_1, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K and IQ4_XS weights by F32 tokens;
// everything else stays with ggml's CPU backend. It takes single tokens too: its one-token
// sums are ggml's bit for bit and come sooner, so plain decoding gains as well.
#include <pybind11/pybind11.h>

#include <immintrin.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "ggml_abi.hpp"

namespace py = pybind11;
using namespace ggml_abi;

namespace {

api g_api;
std::atomic<int> g_threads{1};
std::atomic<int64_t> g_products{0};  // products computed here (tests read it)
std::atomic<int64_t> g_min_batch{1};

// What the kernels know of a weight type: its block (elements, bytes) and the format ggml's
// one-token kernel reads the tokens in (Q8_0 for the 32-weight types, Q8_K for the K-quants).
typedef void (*rows_fn)(const uint8_t *, size_t, int64_t, int64_t, int, const uint8_t *const *, int64_t, float *,
                        size_t);
struct weight_kind {
  int64_t block_elems = 0;
  size_t block_bytes = 0;
  int32_t token_type = 0;
  size_t token_block_bytes = 0;
  rows_fn rows = nullptr;
};

constexpr size_t kQ8_0 = 34;   // fp16 scale, 32 int8
constexpr size_t kQ8_K = 292;  // float scale, 256 int8, 16 int16 sums of 16
constexpr size_t kQ8_1 = 36;   // fp16 scale, fp16 scale times the sum, 32 int8

// A product the compiler may not fuse with the add after it (the module builds with
// -ffp-contract=off; this keeps it so under other flags too)
inline float mul_no_contract(float a, float b) {
  volatile float p = a * b;
  return p;
}

// IQ4_NL's 16 weight values (llama.cpp's table)
alignas(16) const int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};


#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2_kernels {
#define NGC_KERNELS_VNNI 0
#include "kernels.inc"
#undef NGC_KERNELS_VNNI
}  // namespace avx2_kernels
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")
namespace vnni_kernels {
#define NGC_KERNELS_VNNI 1
#include "kernels.inc"
#undef NGC_KERNELS_VNNI
}  // namespace vnni_kernels
#pragma GCC pop_options

enum class isa { none, avx2, vnni };

isa detect_isa() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c"))
    return isa::none;
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl")) return isa::vnni;
  return isa::avx2;
}

const isa g_best = detect_isa();

const char *isa_name(isa i) { return i == isa::vnni ? "avx512vnni" : i == isa::avx2 ? "avx2" : "none"; }

weight_kind kind_of(int32_t t, isa which = g_best) {
  if (which == isa::none) return {};
#define NGC_ROWS(T) (which == isa::vnni ? &vnni_kernels::rows_times_tokens<T> : &avx2_kernels::rows_times_tokens<T>)
  switch (t) {
    case TYPE_Q8_0: return {32, 34, TYPE_Q8_0, kQ8_0, NGC_ROWS(TYPE_Q8_0)};
    case TYPE_Q5_0: return {32, 22, TYPE_Q8_0, kQ8_0, NGC_ROWS(TYPE_Q5_0)};
    case TYPE_Q4_0: return {32, 18, TYPE_Q8_0, kQ8_0, NGC_ROWS(TYPE_Q4_0)};
    case TYPE_Q4_1: return {32, 20, TYPE_Q8_1, kQ8_1, NGC_ROWS(TYPE_Q4_1)};
    case TYPE_Q5_1: return {32, 24, TYPE_Q8_1, kQ8_1, NGC_ROWS(TYPE_Q5_1)};
    case TYPE_Q4_K: return {256, 144, TYPE_Q8_K, kQ8_K, NGC_ROWS(TYPE_Q4_K)};
    case TYPE_Q5_K: return {256, 176, TYPE_Q8_K, kQ8_K, NGC_ROWS(TYPE_Q5_K)};
    case TYPE_Q6_K: return {256, 210, TYPE_Q8_K, kQ8_K, NGC_ROWS(TYPE_Q6_K)};
    case TYPE_IQ4_NL: return {32, 18, TYPE_Q8_0, kQ8_0, NGC_ROWS(TYPE_IQ4_NL)};
    case TYPE_IQ4_XS: return {256, 136, TYPE_Q8_K, kQ8_K, NGC_ROWS(TYPE_IQ4_XS)};
    default: return {};
  }
#undef NGC_ROWS
}

bool is_product_we_take(const tensor *op) {
  const tensor *w = op->src[0];
  const tensor *x = op->src[1];
  if (!w || !x) return false;
  const weight_kind kind = kind_of(w->type);
  if (!kind.rows || x->type != TYPE_F32 || op->type != TYPE_F32 || w->extra != nullptr) return false;
  if (w->ne[0] % kind.block_elems != 0 || w->ne[2] != 1 || w->ne[3] != 1) return false;
  if (w->nb[0] != kind.block_bytes || w->nb[1] != kind.block_bytes * static_cast<size_t>(w->ne[0] / kind.block_elems))
    return false;
  if (x->ne[0] != w->ne[0] || x->ne[2] != 1 || x->ne[3] != 1 || x->nb[0] != sizeof(float)) return false;
  if (op->nb[0] != sizeof(float) || op->ne[0] != w->ne[1] || op->ne[1] != x->ne[1]) return false;
  return x->ne[1] >= g_min_batch.load(std::memory_order_relaxed);
}

// A product's rows in chunks of kChunk, shared out to the threads in contiguous runs.
constexpr int64_t kChunk = 16;
struct rows_job {
  rows_fn rows;
  const uint8_t *w;
  size_t w_stride;
  int64_t m;
  int nblocks;
  const uint8_t *const *cols;
  int64_t n;
  float *dst;
  size_t dst_col;
  int64_t chunks;
};

void run_chunks(const rows_job &j, int64_t c0, int64_t c1) {
  for (int64_t ch = c0; ch < c1; ++ch) {
    const int64_t r0 = ch * kChunk;
    const int64_t r1 = r0 + kChunk < j.m ? r0 + kChunk : j.m;
    j.rows(j.w, j.w_stride, r0, r1, j.nblocks, j.cols, j.n, j.dst, j.dst_col);
  }
}

// Runs in each thread of the team. The team is ggml's own: the same OpenMP runtime as its
// CPU backend (found in the process, not linked), so no second pool of threads spins against
// it on the same cores.
void team_member(void *p) {
  const rows_job &j = *static_cast<const rows_job *>(p);
  const int64_t t = g_api.omp_get_thread_num(), nt = g_api.omp_get_num_threads();
  run_chunks(j, j.chunks * t / nt, j.chunks * (t + 1) / nt);
}

struct backend_state {
  std::vector<uint8_t> quantized;  // the tokens in Q8_0, the format ggml's one-token kernel reads
  std::vector<const uint8_t *> cols;
};

int32_t mul_mat(backend_state &st, tensor *op) {
  const tensor *w = op->src[0];
  const tensor *x = op->src[1];
  const weight_kind kind = kind_of(w->type);
  const int64_t k = w->ne[0], m = w->ne[1], n = x->ne[1];
  const int nblocks = static_cast<int>(k / kind.block_elems);
  // the tokens in the format ggml's one-token kernel reads, quantized by ggml's own function
  const size_t qrow = static_cast<size_t>(k / (kind.token_type == TYPE_Q8_K ? 256 : 32)) * kind.token_block_bytes;
  st.quantized.resize(qrow * static_cast<size_t>(n));
  st.cols.resize(static_cast<size_t>(n));
  const from_float_t quantize = g_api.get_type_traits_cpu(kind.token_type)->from_float;
  for (int64_t c = 0; c < n; ++c) {
    const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x->data) + c * x->nb[1]);
    quantize(src, st.quantized.data() + c * qrow, k);
    st.cols[static_cast<size_t>(c)] = st.quantized.data() + c * qrow;
  }
  rows_job job{kind.rows, static_cast<const uint8_t *>(w->data), w->nb[1], m, nblocks, st.cols.data(), n,
               static_cast<float *>(op->data), op->nb[1] / sizeof(float), (m + kChunk - 1) / kChunk};
  const int threads = g_threads.load(std::memory_order_relaxed);
  if (threads > 1 && job.chunks > 1) {
    g_api.gomp_parallel(team_member, &job, static_cast<unsigned>(threads), 0);
  } else {
    run_chunks(job, 0, job.chunks);
  }
  g_products.fetch_add(1, std::memory_order_relaxed);
  return STATUS_SUCCESS;
}

// ---- the backend, device and registry objects ggml sees --------------------------------------

guid g_guid = {{0x6e, 0x67, 0x72, 0x61, 0x6d, 0x63, 0x61, 0x63, 0x68, 0x65, 0x2d, 0x65, 0x78, 0x61, 0x63, 0x74}};
const char *kName = "ngramcache-exact";
const char *kDescription = "ngramcache: batched matrix products whose rows equal one-token rows";

const char *backend_name(backend *) { return kName; }
void backend_free(backend *b) {
  delete static_cast<backend_state *>(b->context);
  delete b;
}
void backend_sync(backend *) {}
int32_t compute_nodes(backend_state &st, cgraph *g);

// No C++ exception may cross ggml's C frames: a failed allocation becomes ggml's status
int32_t backend_compute(backend *b, cgraph *g) {
  try {
    return compute_nodes(*static_cast<backend_state *>(b->context), g);
  } catch (const std::bad_alloc &) {
    return -2;  // GGML_STATUS_ALLOC_FAILED
  } catch (...) {
    return -1;  // GGML_STATUS_FAILED
  }
}

int32_t compute_nodes(backend_state &st, cgraph *g) {
  const int n = g_api.graph_n_nodes(g);
  for (int i = 0; i < n; ++i) {
    tensor *t = g_api.graph_node(g, i);
    switch (t->op) {
      case OP_NONE: case OP_RESHAPE: case OP_VIEW: case OP_PERMUTE: case OP_TRANSPOSE: break;
      case OP_MUL_MAT: {
        const int32_t s = mul_mat(st, t);
        if (s != STATUS_SUCCESS) return s;
        break;
      }
      default: return -1;  // GGML_STATUS_FAILED: the scheduler gave an operation never accepted
    }
  }
  return STATUS_SUCCESS;
}

device g_device;
reg g_reg;

backend *dev_init(device *d, const char *) {
  auto *b = new backend();
  b->id = &g_guid;
  b->iface.get_name = backend_name;
  b->iface.free = backend_free;
  b->iface.synchronize = backend_sync;
  b->iface.graph_compute = backend_compute;
  b->dev = d;
  b->context = new backend_state();
  return b;
}
const char *dev_name(device *) { return kName; }
const char *dev_description(device *) { return kDescription; }
void dev_memory(device *, size_t *free, size_t *total) { *free = 0; *total = 0; }
int32_t dev_get_type(device *) { return DEV_ACCEL; }
void dev_props_fn(device *d, dev_props *p) {
  p->name = kName;
  p->description = kDescription;
  dev_memory(d, &p->memory_free, &p->memory_total);
  p->type = DEV_ACCEL;
  p->device_id = nullptr;
  p->caps = dev_caps{false, false, false, false, false};
}
buffer_type *dev_buft(device *) { return g_api.cpu_buffer_type(); }
bool dev_supports_op(device *, const tensor *op) {
  switch (op->op) {
    case OP_NONE: case OP_RESHAPE: case OP_VIEW: case OP_PERMUTE: case OP_TRANSPOSE: return true;
    case OP_MUL_MAT: return is_product_we_take(op);
    default: return false;
  }
}
bool dev_supports_buft(device *, buffer_type *bt) { return g_api.buft_is_host(bt); }

const char *reg_name(reg *) { return kName; }
size_t reg_count(reg *) { return 1; }
device *reg_device(reg *, size_t i) { return i == 0 ? &g_device : nullptr; }
void *reg_proc(reg *, const char *) { return nullptr; }

std::mutex g_install_lock;
bool g_registered = false;

template <typename F>
F fn(py::dict addrs, const char *name) {
  if (!addrs.contains(name)) throw std::invalid_argument(std::string("missing ggml function ") + name);
  const auto a = addrs[name].cast<uintptr_t>();
  if (a == 0) throw std::invalid_argument(std::string("null address for ggml function ") + name);
  return reinterpret_cast<F>(a);
}

bool cpu_has_kernels() { return g_best != isa::none; }

}  // namespace

PYBIND11_MODULE(_exact_matmul, m) {
  m.doc() = "Exact batched matrix products for llama.cpp's CPU backend (a ggml accelerator backend).";
  m.def("cpu_supported", &cpu_has_kernels, "Whether this CPU runs the kernels (AVX2, FMA, F16C).");
  m.def("kernels", []() { return std::string(isa_name(g_best)); },
        "The kernels this CPU gets: \"avx512vnni\", \"avx2\" or \"none\".");
  m.def(
      "probe_layout",
      [](uintptr_t t_addr, int32_t type, int64_t ne0, int64_t ne1, const std::string &name, int32_t op,
         uintptr_t src0, uintptr_t src1) {
        const auto *t = reinterpret_cast<const tensor *>(t_addr);
        return t->type == type && t->ne[0] == ne0 && t->ne[1] == ne1 && t->ne[2] == 1 && t->ne[3] == 1 &&
               std::string(t->name) == name && t->op == op && reinterpret_cast<uintptr_t>(t->src[0]) == src0 &&
               reinterpret_cast<uintptr_t>(t->src[1]) == src1;
      },
      "Whether the ggml tensor at t_addr reads as expected through this module's layout.");
  m.def(
      "register_backend",
      [](py::dict addrs, int threads) {
        std::lock_guard<std::mutex> lock(g_install_lock);
        if (threads < 1) throw std::invalid_argument("threads must be at least 1");
        g_threads.store(threads);
        if (g_registered) return false;
        g_api.backend_register = fn<void (*)(reg *)>(addrs, "ggml_backend_register");
        g_api.cpu_buffer_type = fn<buffer_type *(*)()>(addrs, "ggml_backend_cpu_buffer_type");
        g_api.buft_is_host = fn<bool (*)(buffer_type *)>(addrs, "ggml_backend_buft_is_host");
        g_api.graph_n_nodes = fn<int (*)(cgraph *)>(addrs, "ggml_graph_n_nodes");
        g_api.graph_node = fn<tensor *(*)(cgraph *, int)>(addrs, "ggml_graph_node");
        g_api.get_type_traits_cpu = fn<const type_traits_cpu *(*)(int32_t)>(addrs, "ggml_get_type_traits_cpu");
        g_api.gomp_parallel = fn<void (*)(void (*)(void *), void *, unsigned, unsigned)>(addrs, "GOMP_parallel");
        g_api.omp_get_thread_num = fn<int (*)()>(addrs, "omp_get_thread_num");
        g_api.omp_get_num_threads = fn<int (*)()>(addrs, "omp_get_num_threads");
        device_i &di = g_device.iface;
        di = {};
        di.get_name = dev_name;
        di.get_description = dev_description;
        di.get_memory = dev_memory;
        di.get_type = dev_get_type;
        di.get_props = dev_props_fn;
        di.init_backend = dev_init;
        di.get_buffer_type = dev_buft;
        di.supports_op = dev_supports_op;
        di.supports_buft = dev_supports_buft;
        g_device.owner = &g_reg;
        g_reg.api_version = kBackendApiVersion;
        g_reg.iface.get_name = reg_name;
        g_reg.iface.get_device_count = reg_count;
        g_reg.iface.get_device = reg_device;
        g_reg.iface.get_proc_address = reg_proc;
        g_api.backend_register(&g_reg);
        g_registered = true;
        return true;
      },
      py::arg("addresses"), py::arg("threads"),
      "Register the backend with ggml (once per process; later calls only set the thread count). "
      "Returns whether this call registered it.");
  m.def("products", []() { return g_products.load(); }, "Matrix products computed by the backend so far.");
  m.def(
      "set_min_batch", [](int64_t n) {
        if (n < 1) throw std::invalid_argument("min batch must be at least 1");
        g_min_batch.store(n);
      },
      "Smallest token count the backend takes (1, the default: every product of its types; 2 leaves "
      "single tokens to ggml's CPU backend). llama.cpp asks when it builds a graph of a new shape: a graph "
      "it reuses keeps the backends it had.");
  m.def(
      "dot_rows",
      [](int32_t type, py::buffer weights, py::buffer tokens, int64_t k, const std::string &kernels) {
        // The kernel alone, for tests: weights (rows of type) times tokens already quantized
        // in the type's token format (Q8_0, or Q8_K for the K-quants).
        isa which = g_best;
        if (kernels == "avx2") which = g_best == isa::none ? isa::none : isa::avx2;
        else if (kernels != "best") {
          if (kernels != "avx512vnni") throw std::invalid_argument("kernels must be best, avx2 or avx512vnni");
          if (g_best != isa::vnni) throw std::invalid_argument("this CPU lacks AVX-512 VNNI");
        }
        const weight_kind kind = kind_of(type, which);
        if (!kind.rows) throw std::invalid_argument("type not supported on this CPU");
        if (k <= 0 || k % kind.block_elems)
          throw std::invalid_argument("k must be a positive multiple of " + std::to_string(kind.block_elems));
        const py::buffer_info wi = weights.request(), yi = tokens.request();
        const int64_t nb = k / kind.block_elems;
        const size_t wrow = kind.block_bytes * static_cast<size_t>(nb), qrow = kind.token_block_bytes * static_cast<size_t>(nb);
        const size_t wbytes = static_cast<size_t>(wi.size * wi.itemsize), ybytes = static_cast<size_t>(yi.size * yi.itemsize);
        if (wbytes == 0 || ybytes == 0 || wbytes % wrow || ybytes % qrow) throw std::invalid_argument("buffer sizes are not whole rows");
        const int64_t m_rows = static_cast<int64_t>(wbytes / wrow), n = static_cast<int64_t>(ybytes / qrow);
        std::vector<const uint8_t *> cols(static_cast<size_t>(n));
        for (int64_t c = 0; c < n; ++c) cols[static_cast<size_t>(c)] = static_cast<const uint8_t *>(yi.ptr) + c * qrow;
        std::string out(static_cast<size_t>(m_rows * n) * sizeof(float), '\0');
        kind.rows(static_cast<const uint8_t *>(wi.ptr), wrow, 0, m_rows, static_cast<int>(nb), cols.data(), n,
                  reinterpret_cast<float *>(&out[0]), static_cast<size_t>(m_rows));
        return py::bytes(out);
      },
      py::arg("type"), py::arg("weights"), py::arg("tokens"), py::arg("k"), py::arg("kernels") = "best",
      "Float32 bytes, token-major: token c's sums at [c * rows, (c + 1) * rows).");
}
