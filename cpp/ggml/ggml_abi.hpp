// The parts of ggml's C interface that the exact-matmul backend touches, declared by hand for the
// ggml that llama-cpp-python 0.3.36 ships (ggml backend API version 2). ngramcache does not build
// against llama.cpp's headers: llama-cpp-python installs none. The Python side loads this only for
// that llama-cpp-python version, and `probe_layout` checks the tensor layout against tensors
// that ggml itself creates before anything is registered.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ggml_abi {

constexpr int kMaxDims = 4;
constexpr int kMaxSrc = 10;
constexpr int kMaxOpParams = 64;
constexpr int kMaxName = 64;

enum type : int32_t {
  TYPE_F32 = 0, TYPE_F16 = 1, TYPE_Q4_0 = 2, TYPE_Q4_1 = 3, TYPE_Q5_0 = 6, TYPE_Q5_1 = 7,
  TYPE_Q8_0 = 8, TYPE_Q8_1 = 9, TYPE_Q4_K = 12, TYPE_Q5_K = 13, TYPE_Q6_K = 14, TYPE_Q8_K = 15,
  TYPE_IQ4_NL = 20, TYPE_IQ4_XS = 23,
};

enum op : int32_t {
  OP_NONE = 0, OP_MUL_MAT = 29, OP_RESHAPE = 36, OP_VIEW = 37, OP_PERMUTE = 38, OP_TRANSPOSE = 39,
};

enum buffer_usage : int32_t { USAGE_ANY = 0, USAGE_WEIGHTS = 1, USAGE_COMPUTE = 2 };
enum dev_type : int32_t { DEV_CPU = 0, DEV_GPU = 1, DEV_IGPU = 2, DEV_ACCEL = 3 };
enum status : int32_t { STATUS_SUCCESS = 0 };

struct buffer;
struct buffer_type;
struct device;
struct backend;
struct reg;
struct cgraph;

struct tensor {
  int32_t type;
  buffer *buf;
  int64_t ne[kMaxDims];
  size_t nb[kMaxDims];
  int32_t op;
  int32_t op_params[kMaxOpParams / sizeof(int32_t)];
  int32_t flags;
  tensor *src[kMaxSrc];
  tensor *view_src;
  size_t view_offs;
  void *data;
  char name[kMaxName];
  void *extra;
  char padding[8];
};

struct buffer_i {
  void *fns[11];
};
struct buffer {
  buffer_i iface;
  buffer_type *buft;
  void *context;
  size_t size;
  int32_t usage;
};

struct guid {
  uint8_t bytes[16];
};

struct backend_i {
  const char *(*get_name)(backend *);
  void (*free)(backend *);
  void *set_tensor_async;
  void *get_tensor_async;
  void *set_tensor_2d_async;
  void *get_tensor_2d_async;
  void *cpy_tensor_async;
  void (*synchronize)(backend *);
  void *graph_plan_create;
  void *graph_plan_free;
  void *graph_plan_update;
  void *graph_plan_compute;
  int32_t (*graph_compute)(backend *, cgraph *);
  void *event_record;
  void *event_wait;
  void *graph_optimize;
};
struct backend {
  guid *id;
  backend_i iface;
  device *dev;
  void *context;
};

struct dev_caps {
  bool async, host_buffer, buffer_from_host_ptr, events, mmap_support;
};
struct dev_props {
  const char *name;
  const char *description;
  size_t memory_free;
  size_t memory_total;
  int32_t type;
  const char *device_id;
  dev_caps caps;
};

struct device_i {
  const char *(*get_name)(device *);
  const char *(*get_description)(device *);
  void (*get_memory)(device *, size_t *, size_t *);
  int32_t (*get_type)(device *);
  void (*get_props)(device *, dev_props *);
  backend *(*init_backend)(device *, const char *);
  buffer_type *(*get_buffer_type)(device *);
  void *get_host_buffer_type;
  void *buffer_from_host_ptr;
  bool (*supports_op)(device *, const tensor *);
  bool (*supports_buft)(device *, buffer_type *);
  void *offload_op;
  void *event_new;
  void *event_free;
  void *event_synchronize;
};
struct device {
  device_i iface;
  reg *owner;
  void *context;
};

struct reg_i {
  const char *(*get_name)(reg *);
  size_t (*get_device_count)(reg *);
  device *(*get_device)(reg *, size_t);
  void *(*get_proc_address)(reg *, const char *);
};
struct reg {
  int api_version;
  reg_i iface;
  void *context;
};
constexpr int kBackendApiVersion = 2;

typedef void (*from_float_t)(const float *, void *, int64_t);
typedef void (*vec_dot_t)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
struct type_traits_cpu {
  from_float_t from_float;
  vec_dot_t vec_dot;
  int32_t vec_dot_type;
  int64_t nrows;
};

// The functions of ggml this backend calls, found by the Python side in the libraries
// llama-cpp-python loaded (no link-time dependency on them).
struct api {
  void (*backend_register)(reg *) = nullptr;
  buffer_type *(*cpu_buffer_type)() = nullptr;
  bool (*buft_is_host)(buffer_type *) = nullptr;
  int (*graph_n_nodes)(cgraph *) = nullptr;
  tensor *(*graph_node)(cgraph *, int) = nullptr;
  const type_traits_cpu *(*get_type_traits_cpu)(int32_t) = nullptr;
  // the OpenMP runtime (libgomp) that ggml's CPU backend runs its threads in
  void (*gomp_parallel)(void (*)(void *), void *, unsigned, unsigned) = nullptr;
  int (*omp_get_thread_num)() = nullptr;
  int (*omp_get_num_threads)() = nullptr;
};

}  // namespace ggml_abi
