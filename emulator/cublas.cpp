// cuBLAS on the emulated device: handles, streams and the fp32 GEMMs, with cuBLAS's own column-major
// semantics carried out by the CPU BLAS (CBLAS, column-major). Operand order, transposes and leading
// dimensions are therefore exercised for real, and an operand that reaches past its allocation is
// reported instead of read. TF32 compute rounds the operands to TF32 (10-bit mantissa) first.
#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>
#include <sstream>
#include <vector>

#include "emulator/device.h"

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
};

// Checks that every batch of the operand lies inside one device allocation.
std::string check_operand(const Operand& operand, int batch_count, Allocation*& allocation) {
    allocation = find_allocation(operand.pointer);
    std::ostringstream problem;
    if (allocation == nullptr || allocation->pinned) {
        problem << "operand " << operand.name << " (" << operand.pointer << ") is not device memory";
        return problem.str();
    }
    const long long elements = static_cast<long long>(operand.columns - 1) * operand.leading + operand.rows +
                               static_cast<long long>(batch_count - 1) * operand.stride;
    const auto start = reinterpret_cast<uintptr_t>(operand.pointer), base = reinterpret_cast<uintptr_t>(allocation->base);
    const auto end = start + static_cast<uintptr_t>(elements) * sizeof(float);
    if (end > base + allocation->bytes) {
        problem << "operand " << operand.name << " (" << operand.rows << " x " << operand.columns << ", leading dimension "
                << operand.leading << ", " << batch_count << " batch(es)) reaches " << (end - base - allocation->bytes)
                << " bytes past the end of its " << allocation->bytes << "-byte allocation";
        return problem.str();
    }
    return {};
}

cublasStatus_t gemm(cublasHandle_t handle, cublasOperation_t transpose_a, cublasOperation_t transpose_b, int m, int n,
                    int k, const float* alpha, const float* a, int lda, long long stride_a, const float* b, int ldb,
                    long long stride_b, const float* beta, float* c, int ldc, long long stride_c, int batch_count,
                    bool tf32, const char* call) {
    Lock lock(device_mutex());
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    const bool valid_operations = (transpose_a == CUBLAS_OP_N || transpose_a == CUBLAS_OP_T) &&
                                  (transpose_b == CUBLAS_OP_N || transpose_b == CUBLAS_OP_T);
    if (!valid_operations) return CUBLAS_STATUS_INVALID_VALUE;
    const int a_rows = transpose_a == CUBLAS_OP_N ? m : k, a_columns = transpose_a == CUBLAS_OP_N ? k : m;
    const int b_rows = transpose_b == CUBLAS_OP_N ? k : n, b_columns = transpose_b == CUBLAS_OP_N ? n : k;
    if (m < 0 || n < 0 || k < 0 || batch_count < 0 || lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) ||
        ldc < std::max(1, m)) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (handle->pointer_mode != CUBLAS_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0 || batch_count == 0) return CUBLAS_STATUS_SUCCESS;
    if (sticky_error() != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
    StreamState* stream = find_stream(handle->stream);
    if (stream == nullptr) return CUBLAS_STATUS_EXECUTION_FAILED;

    std::vector<Operand> operands{{"C", c, m, n, ldc, stride_c}};
    if (k > 0) {
        operands.push_back({"A", a, a_rows, a_columns, lda, stride_a});
        operands.push_back({"B", b, b_rows, b_columns, ldb, stride_b});
    }
    std::vector<Access> accesses;
    for (const Operand& operand : operands) {
        Allocation* allocation = nullptr;
        const std::string problem = check_operand(operand, batch_count, allocation);
        if (!problem.empty()) {
            raise_fault(cudaErrorIllegalAddress, std::string(call) + ": " + problem);
            return CUBLAS_STATUS_EXECUTION_FAILED;
        }
        auto same = std::find_if(accesses.begin(), accesses.end(), [&](const Access& access) { return access.allocation == allocation; });
        if (same == accesses.end()) {
            accesses.push_back(Access{allocation, operand.pointer == c});
        } else {
            same->writes = same->writes || operand.pointer == c;
        }
    }
    const float alpha_value = *alpha, beta_value = *beta; // host pointer mode: read at the call
    auto run = [=] {
        const auto order = CblasColMajor;
        const auto operation_a = transpose_a == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
        const auto operation_b = transpose_b == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
        std::vector<float> rounded_a, rounded_b;
        for (int batch = 0; batch < batch_count; ++batch) {
            const float* batch_a = a + batch * stride_a;
            const float* batch_b = b + batch * stride_b;
            if (tf32 && k > 0) {
                rounded_a.assign(batch_a, batch_a + static_cast<long long>(a_columns - 1) * lda + a_rows);
                rounded_b.assign(batch_b, batch_b + static_cast<long long>(b_columns - 1) * ldb + b_rows);
                std::transform(rounded_a.begin(), rounded_a.end(), rounded_a.begin(), round_to_tf32);
                std::transform(rounded_b.begin(), rounded_b.end(), rounded_b.begin(), round_to_tf32);
                batch_a = rounded_a.data();
                batch_b = rounded_b.data();
            }
            cblas_sgemm(order, operation_a, operation_b, m, n, k, alpha_value, batch_a, lda, batch_b, ldb, beta_value,
                        c + batch * stride_c, ldc);
        }
    };
    std::ostringstream description;
    description << call << " (m " << m << ", n " << n << ", k " << k << ")";
    Operation operation{std::make_shared<const std::string>(description.str()), run, {}};
    return enqueue(*stream, std::move(operation), accesses) == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                                                           : CUBLAS_STATUS_EXECUTION_FAILED;
}

bool float_types(cudaDataType a, cudaDataType b, cudaDataType c) {
    return a == CUDA_R_32F && b == CUDA_R_32F && c == CUDA_R_32F;
}

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

} // namespace
} // namespace engine::emulator

using namespace engine::emulator;

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
    if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) {
        (void)cudaGetLastError();
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
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
    bool supported = false;
    const bool tf32 = tf32_compute(handle, computeType, supported);
    if (!supported || !float_types(Atype, Btype, Ctype)) return CUBLAS_STATUS_NOT_SUPPORTED;
    (void)algo;
    return gemm(handle, transa, transb, m, n, k, static_cast<const float*>(alpha), static_cast<const float*>(A), lda, 0,
                static_cast<const float*>(B), ldb, 0, static_cast<const float*>(beta), static_cast<float*>(C), ldc, 0, 1,
                tf32, "cublasGemmEx");
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo) {
    bool supported = false;
    const bool tf32 = tf32_compute(handle, computeType, supported);
    if (!supported || !float_types(Atype, Btype, Ctype)) return CUBLAS_STATUS_NOT_SUPPORTED;
    (void)algo;
    return gemm(handle, transa, transb, m, n, k, static_cast<const float*>(alpha), static_cast<const float*>(A), lda,
                strideA, static_cast<const float*>(B), ldb, strideB, static_cast<const float*>(beta), static_cast<float*>(C),
                ldc, strideC, batchCount, tf32, "cublasGemmStridedBatchedEx");
}
