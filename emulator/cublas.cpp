// cuBLAS on the emulated device: handles, streams and the fp32 GEMMs (and bf16 ones computed in f32), with cuBLAS's own column-major
// semantics carried out by the CPU BLAS (CBLAS, column-major). Operand order, transposes and leading
// dimensions are therefore exercised for real, and an operand that reaches past its allocation is
// reported instead of read. TF32 compute rounds the operands to TF32 (10-bit mantissa) first. The GEMM itself
// (enqueue_gemm, emulator/blas.h) also serves the emulated cuBLASLt (cublaslt.cpp).
#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "emulator/blas.h"
#include "base/bfloat16.h"
#include "emulator/testing.h"

struct cublasContext {
    cudaStream_t stream = nullptr;
    cublasMath_t math_mode = CUBLAS_DEFAULT_MATH;
    cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
};

namespace engine::emulator {
namespace {

using Lock = std::lock_guard<std::recursive_mutex>;

float round_to_tf32(float value) {
    if (!std::isfinite(value)) return value;
    uint32_t bits = std::bit_cast<uint32_t>(value);
    bits += 0xFFFu + ((bits >> 13) & 1u); // round to nearest, ties to even, at the 13 dropped bits
    return std::bit_cast<float>(bits & ~0x1FFFu);
}

struct Operand {
    const char* name;
    const void* pointer;
    int rows, columns, leading; // column-major, as stored
    long long stride;           // elements between batches
    size_t element_bytes = sizeof(float);
};

// Checks that `bytes` from `pointer` lie inside one device allocation.
std::string check_extent(const char* name, const void* pointer, size_t bytes, const std::string& shape,
                         Allocation*& allocation) {
    allocation = find_allocation(pointer);
    std::ostringstream problem;
    if (allocation == nullptr || allocation->pinned) {
        problem << "operand " << name << " (" << pointer << ") is not device memory";
        return problem.str();
    }
    const auto start = reinterpret_cast<uintptr_t>(pointer), base = reinterpret_cast<uintptr_t>(allocation->base);
    const auto end = start + bytes;
    if (end > base + allocation->bytes) {
        problem << "operand " << name << " (" << shape << ") reaches " << (end - base - allocation->bytes)
                << " bytes past the end of its " << allocation->bytes << "-byte allocation";
        return problem.str();
    }
    return {};
}

// Checks that every batch of the operand lies inside one device allocation.
std::string check_operand(const Operand& operand, int batch_count, Allocation*& allocation) {
    const long long elements = static_cast<long long>(operand.columns - 1) * operand.leading + operand.rows +
                               static_cast<long long>(batch_count - 1) * operand.stride;
    std::ostringstream shape;
    shape << operand.rows << " x " << operand.columns << ", leading dimension " << operand.leading << ", "
          << batch_count << " batch(es)";
    return check_extent(operand.name, operand.pointer, static_cast<size_t>(elements) * operand.element_bytes, shape.str(),
                        allocation);
}

// Registers `allocation` as read or written, once per allocation (an operand written wins).
void add_access(std::vector<Access>& accesses, Allocation* allocation, bool writes) {
    auto same = std::find_if(accesses.begin(), accesses.end(), [&](const Access& access) { return access.allocation == allocation; });
    if (same == accesses.end()) {
        accesses.push_back(Access{allocation, writes});
    } else {
        same->writes = same->writes || writes;
    }
}

void add_bias(float* c, const float* bias, int m, int n, int ldc) {
    for (int column = 0; column < n; ++column) {
        float* c_column = c + static_cast<long long>(column) * ldc;
        for (int row = 0; row < m; ++row) c_column[row] += bias[row];
    }
}

size_t element_bytes(cudaDataType type) { return type == CUDA_R_16BF ? sizeof(engine::bfloat16) : sizeof(float); }

// The (rows, columns, leading) column-major matrix at `values` (bf16) as f32 (exact), same leading dimension.
std::vector<float> widened(const void* values, int rows, int columns, int leading) {
    const auto* source = static_cast<const engine::bfloat16*>(values);
    std::vector<float> out(static_cast<size_t>(static_cast<long long>(columns - 1) * leading + rows));
    for (size_t i = 0; i < out.size(); ++i) out[i] = engine::to_float(source[i]);
    return out;
}

// cuBLAS's argument checks; the handle's own checks are the caller's.
cublasStatus_t gemm(cublasHandle_t handle, cublasOperation_t transpose_a, cublasOperation_t transpose_b, int m, int n,
                    int k, const float* alpha, const void* a, int lda, long long stride_a, const void* b, int ldb,
                    long long stride_b, const float* beta, void* c, int ldc, long long stride_c, int batch_count,
                    bool tf32, const char* call, cudaDataType operand_type = CUDA_R_32F,
                    cudaDataType c_type = CUDA_R_32F) {
    Lock lock(device_mutex());
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (handle->pointer_mode != CUBLAS_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    GemmArguments arguments;
    arguments.transpose_a = transpose_a;
    arguments.transpose_b = transpose_b;
    arguments.m = m, arguments.n = n, arguments.k = k;
    arguments.alpha = *alpha, arguments.beta = *beta;
    arguments.a = a, arguments.lda = lda, arguments.stride_a = stride_a;
    arguments.b = b, arguments.ldb = ldb, arguments.stride_b = stride_b;
    arguments.c = c, arguments.ldc = ldc, arguments.stride_c = stride_c;
    arguments.batch_count = batch_count;
    arguments.tf32 = tf32;
    arguments.operand_type = operand_type, arguments.c_type = c_type;
    arguments.call = call;
    return enqueue_gemm(handle->stream, arguments);
}

bool float_types(cudaDataType a, cudaDataType b, cudaDataType c) {
    return a == CUDA_R_32F && b == CUDA_R_32F && c == CUDA_R_32F;
}

// bf16 A and B with an f32 or bf16 C: the emulated mixed-precision GEMMs (f32 compute only).
bool bf16_types(cudaDataType a, cudaDataType b, cudaDataType c) {
    return a == CUDA_R_16BF && b == CUDA_R_16BF && (c == CUDA_R_32F || c == CUDA_R_16BF);
}

// The data and compute types emulated for a GemmEx call; a refusal names what is not.
cublasStatus_t check_ex_types(cublasHandle_t handle, cublasComputeType_t compute, cudaDataType a, cudaDataType b,
                              cudaDataType c, const char* call, bool& tf32);

// The handle allows TF32 for fp32 GEMMs; the mode's low bits name the math, the high bits are flags.
bool tf32_math(cublasHandle_t handle) {
    return handle != nullptr && (static_cast<unsigned>(handle->math_mode) & 0xfu) == CUBLAS_TF32_TENSOR_OP_MATH;
}

// The compute types of an fp32 GEMM; anything else is not emulated yet. CUBLAS_COMPUTE_32F may use TF32 when
// the handle's math mode allows it; PEDANTIC never does.
bool tf32_compute(cublasHandle_t handle, cublasComputeType_t compute, bool& supported) {
    supported = compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC ||
                compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    return compute == CUBLAS_COMPUTE_32F_FAST_TF32 || (compute == CUBLAS_COMPUTE_32F && tf32_math(handle));
}

std::string last_refusal_message;

cublasStatus_t check_ex_types(cublasHandle_t handle, cublasComputeType_t compute, cudaDataType a, cudaDataType b,
                              cudaDataType c, const char* call, bool& tf32) {
    bool supported = false;
    tf32 = tf32_compute(handle, compute, supported);
    if (supported && float_types(a, b, c)) return CUBLAS_STATUS_SUCCESS;
    // bf16 operands: CUBLAS_COMPUTE_32F(_PEDANTIC) only; TF32 does not apply to them.
    if (bf16_types(a, b, c) && (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC)) {
        tf32 = false;
        return CUBLAS_STATUS_SUCCESS;
    }
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, std::string(call) + ": data types A " + std::to_string(a) + ", B " +
                                                   std::to_string(b) + ", C " + std::to_string(c) + " with compute type " +
                                                   std::to_string(compute) +
                                                   " are not emulated (f32 ones, and bf16 A/B with f32 or bf16 C in "
                                                   "CUBLAS_COMPUTE_32F, are)");
}

} // namespace

cublasStatus_t handle_creation_status() {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) {
        (void)cudaGetLastError();
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t refuse(cublasStatus_t status, const std::string& message) {
    Lock lock(device_mutex());
    last_refusal_message = message;
    std::fprintf(stderr, "CUDA emulator: %s\n", message.c_str());
    return status;
}

std::string last_refusal() {
    Lock lock(device_mutex());
    return last_refusal_message;
}

cublasStatus_t enqueue_gemm(cudaStream_t stream_handle, const GemmArguments& arguments) {
    Lock lock(device_mutex());
    const GemmArguments call = arguments; // the queued product runs later, on this copy
    const bool valid_operations = (call.transpose_a == CUBLAS_OP_N || call.transpose_a == CUBLAS_OP_T) &&
                                  (call.transpose_b == CUBLAS_OP_N || call.transpose_b == CUBLAS_OP_T);
    if (!valid_operations) return CUBLAS_STATUS_INVALID_VALUE;
    const int m = call.m, n = call.n, k = call.k;
    const int a_rows = call.transpose_a == CUBLAS_OP_N ? m : k, a_columns = call.transpose_a == CUBLAS_OP_N ? k : m;
    const int b_rows = call.transpose_b == CUBLAS_OP_N ? k : n, b_columns = call.transpose_b == CUBLAS_OP_N ? n : k;
    if (m < 0 || n < 0 || k < 0 || call.batch_count < 0 || call.lda < std::max(1, a_rows) ||
        call.ldb < std::max(1, b_rows) || call.ldc < std::max(1, m)) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (m == 0 || n == 0 || call.batch_count == 0) return CUBLAS_STATUS_SUCCESS;
    if (sticky_error() != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
    StreamState* stream = find_stream(stream_handle);
    if (stream == nullptr) return CUBLAS_STATUS_EXECUTION_FAILED;

    const size_t operand_bytes = element_bytes(call.operand_type), c_bytes = element_bytes(call.c_type);
    std::vector<Operand> operands{{"C", call.c, m, n, call.ldc, call.stride_c, c_bytes}};
    if (k > 0) {
        operands.push_back({"A", call.a, a_rows, a_columns, call.lda, call.stride_a, operand_bytes});
        operands.push_back({"B", call.b, b_rows, b_columns, call.ldb, call.stride_b, operand_bytes});
    }
    if (call.bias != nullptr) operands.push_back({"bias", call.bias, m, 1, m, 0, c_bytes});
    std::vector<Access> accesses;
    for (const Operand& operand : operands) {
        Allocation* allocation = nullptr;
        const std::string problem = check_operand(operand, call.batch_count, allocation);
        if (!problem.empty()) {
            raise_fault(cudaErrorIllegalAddress, std::string(call.call) + ": " + problem);
            return CUBLAS_STATUS_EXECUTION_FAILED;
        }
        add_access(accesses, allocation, operand.pointer == call.c);
    }
    if (call.workspace_bytes > 0) {
        Allocation* allocation = nullptr;
        const std::string problem = check_extent("workspace", call.workspace, call.workspace_bytes,
                                                 std::to_string(call.workspace_bytes) + " bytes", allocation);
        if (!problem.empty()) {
            raise_fault(cudaErrorIllegalAddress, std::string(call.call) + ": " + problem);
            return CUBLAS_STATUS_EXECUTION_FAILED;
        }
        add_access(accesses, allocation, true);
    }
    auto run = [call, a_rows, a_columns, b_rows, b_columns] {
        const auto order = CblasColMajor;
        const auto operation_a = call.transpose_a == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
        const auto operation_b = call.transpose_b == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
        const bool bf16_operands = call.operand_type == CUDA_R_16BF, bf16_c = call.c_type == CUDA_R_16BF;
        const size_t operand_bytes = element_bytes(call.operand_type), c_bytes = element_bytes(call.c_type);
        std::vector<float> rounded_a, rounded_b, wide_c, wide_bias;
        for (int batch = 0; batch < call.batch_count; ++batch) {
            const void* raw_a = static_cast<const char*>(call.a) + batch * call.stride_a * operand_bytes;
            const void* raw_b = static_cast<const char*>(call.b) + batch * call.stride_b * operand_bytes;
            void* batch_c = static_cast<char*>(call.c) + batch * call.stride_c * c_bytes;
            const auto* batch_a = static_cast<const float*>(raw_a); // f32 operands; bf16 ones are widened below
            const auto* batch_b = static_cast<const float*>(raw_b);
            if (bf16_operands && call.k > 0) { // bf16 -> f32 is exact: the tensor core's exact products
                rounded_a = widened(raw_a, a_rows, a_columns, call.lda);
                rounded_b = widened(raw_b, b_rows, b_columns, call.ldb);
                batch_a = rounded_a.data();
                batch_b = rounded_b.data();
            } else if (call.tf32 && call.k > 0) {
                rounded_a.assign(batch_a, batch_a + static_cast<long long>(a_columns - 1) * call.lda + a_rows);
                rounded_b.assign(batch_b, batch_b + static_cast<long long>(b_columns - 1) * call.ldb + b_rows);
                std::transform(rounded_a.begin(), rounded_a.end(), rounded_a.begin(), round_to_tf32);
                std::transform(rounded_b.begin(), rounded_b.end(), rounded_b.begin(), round_to_tf32);
                batch_a = rounded_a.data();
                batch_b = rounded_b.data();
            }
            // A bf16 C is computed in an f32 copy (beta 0 ignores its old values, NaN included) and rounded once.
            float* result = static_cast<float*>(batch_c);
            if (bf16_c) {
                wide_c = call.beta != 0.0f ? widened(batch_c, call.m, call.n, call.ldc)
                                           : std::vector<float>(static_cast<size_t>(
                                                 static_cast<long long>(call.n - 1) * call.ldc + call.m));
                result = wide_c.data();
            }
            cblas_sgemm(order, operation_a, operation_b, call.m, call.n, call.k, call.alpha, batch_a, call.lda, batch_b,
                        call.ldb, call.beta, result, call.ldc);
            if (call.bias != nullptr) {
                if (bf16_c) wide_bias = widened(call.bias, call.m, 1, call.m);
                add_bias(result, bf16_c ? wide_bias.data() : static_cast<const float*>(call.bias), call.m, call.n,
                         call.ldc);
            }
            if (bf16_c) {
                auto* destination = static_cast<engine::bfloat16*>(batch_c);
                for (int column = 0; column < call.n; ++column) {
                    for (int row = 0; row < call.m; ++row) {
                        const long long index = static_cast<long long>(column) * call.ldc + row;
                        destination[index] = engine::to_bfloat16(result[index]);
                    }
                }
            }
        }
    };
    std::ostringstream description;
    description << call.call << " (m " << m << ", n " << n << ", k " << k << ")";
    Operation operation{std::make_shared<const std::string>(description.str()), run, {}};
    return enqueue(*stream, std::move(operation), accesses) == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                                                           : CUBLAS_STATUS_EXECUTION_FAILED;
}

} // namespace engine::emulator

using namespace engine::emulator;

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
    if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    if (const cublasStatus_t status = handle_creation_status(); status != CUBLAS_STATUS_SUCCESS) return status;
    *handle = new cublasContext();
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    Lock lock(device_mutex());
    if (find_stream(stream) == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* stream) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (stream == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *stream = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->math_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void*, size_t) {
    return handle == nullptr ? CUBLAS_STATUS_NOT_INITIALIZED : CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusName(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}
const char* cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    default: return "unknown error";
    }
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                              const float* beta, float* C, int ldc) {
    const bool tf32 = tf32_math(handle);
    return gemm(handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, tf32, "cublasSgemm");
}
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                         int n, int k, const float* alpha, const float* A, int lda, long long strideA,
                                         const float* B, int ldb, long long strideB, const float* beta, float* C, int ldc,
                                         long long strideC, int batchCount) {
    const bool tf32 = tf32_math(handle);
    return gemm(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC,
                batchCount, tf32, "cublasSgemmStridedBatched");
}
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    bool tf32 = false;
    if (const cublasStatus_t status = check_ex_types(handle, computeType, Atype, Btype, Ctype, "cublasGemmEx", tf32);
        status != CUBLAS_STATUS_SUCCESS)
        return status;
    (void)algo;
    return gemm(handle, transa, transb, m, n, k, static_cast<const float*>(alpha), A, lda, 0, B, ldb, 0,
                static_cast<const float*>(beta), C, ldc, 0, 1, tf32, "cublasGemmEx", Atype, Ctype);
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo) {
    bool tf32 = false;
    if (const cublasStatus_t status =
            check_ex_types(handle, computeType, Atype, Btype, Ctype, "cublasGemmStridedBatchedEx", tf32);
        status != CUBLAS_STATUS_SUCCESS)
        return status;
    (void)algo;
    return gemm(handle, transa, transb, m, n, k, static_cast<const float*>(alpha), A, lda, strideA, B, ldb, strideB,
                static_cast<const float*>(beta), C, ldc, strideC, batchCount, tf32, "cublasGemmStridedBatchedEx",
                Atype, Ctype);
}
