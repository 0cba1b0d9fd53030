// cuBLASLt on the emulated device: the subset libengine calls, an fp32 matmul (f32 operands, or bf16 A and B
// with an f32 or bf16 C/D and bias) with the DEFAULT or BIAS epilogue, over the same queued GEMM as the emulated cuBLAS (emulator/blas.h). Descriptors are the
// emulator's own structs behind cuBLASLt's opaque pointers. What is not emulated (other epilogues,
// attributes, data or compute types) is refused with CUBLAS_STATUS_NOT_SUPPORTED and a message naming it
// (stderr, and emulator::last_refusal()), never silently ignored.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <sstream>
#include <string>

#include "emulator/blas.h"

struct cublasLtContext {};

namespace engine::emulator {
namespace {

using Lock = std::lock_guard<std::recursive_mutex>;

struct MatmulDescription {
    bool tf32 = false;
    bool pedantic_or_fast = false; // CUBLAS_COMPUTE_32F_PEDANTIC or _FAST_TF32: not for bf16 operands
    cublasOperation_t transpose_a = CUBLAS_OP_N, transpose_b = CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;
};

struct Layout {
    uint64_t rows = 0, columns = 0;
    int64_t leading = 0;
    cudaDataType type = CUDA_R_32F;
};

struct Preference {
    uint64_t max_workspace_bytes = 0;
    uint32_t alignment[4] = {256, 256, 256, 256}; // A, B, C, D: cuBLASLt's defaults
};

// What the heuristic promised the algorithm: the alignments it may assume and the workspace it may use.
struct Algorithm {
    static constexpr uint64_t tag = 0x656d756c61746564; // "emulated"
    uint64_t marker;
    uint32_t alignment[4];
};
static_assert(sizeof(Algorithm) <= sizeof(cublasLtMatmulAlgo_t));

MatmulDescription* description_of(cublasLtMatmulDesc_t handle) { return reinterpret_cast<MatmulDescription*>(handle); }
Layout* layout_of(cublasLtMatrixLayout_t handle) { return reinterpret_cast<Layout*>(handle); }
Preference* preference_of(cublasLtMatmulPreference_t handle) { return reinterpret_cast<Preference*>(handle); }

cublasStatus_t not_emulated(const std::string& what) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cuBLASLt: " + what + " is not emulated");
}

template <typename Value>
cublasStatus_t read_attribute(Value& value, const void* buffer, size_t bytes) {
    if (buffer == nullptr || bytes != sizeof(Value)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&value, buffer, sizeof(Value));
    return CUBLAS_STATUS_SUCCESS;
}

bool is_operation(int32_t value) { return value == CUBLAS_OP_N || value == CUBLAS_OP_T; }

// D (m,n) = op(A) (m,k) · op(B) (k,n) [+ C]: the dimensions the layouts imply, or INVALID_VALUE when they
// disagree, as cuBLASLt answers.
struct Shape {
    int m = 0, n = 0, k = 0;
};
cublasStatus_t shape_of(const MatmulDescription& description, const Layout* a, const Layout* b, const Layout* c,
                        const Layout* d, Shape& shape) {
    if (a == nullptr || b == nullptr || c == nullptr || d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    const uint64_t m = d->rows, n = d->columns;
    const uint64_t k = description.transpose_a == CUBLAS_OP_N ? a->columns : a->rows;
    const uint64_t a_rows = description.transpose_a == CUBLAS_OP_N ? a->rows : a->columns;
    const uint64_t b_rows = description.transpose_b == CUBLAS_OP_N ? b->rows : b->columns;
    const uint64_t b_columns = description.transpose_b == CUBLAS_OP_N ? b->columns : b->rows;
    if (a_rows != m || b_rows != k || b_columns != n || c->rows != m || c->columns != n) return CUBLAS_STATUS_INVALID_VALUE;
    // f32 everywhere, or bf16 A and B with C and D alike in f32 or bf16; TF32 only for f32 operands.
    const bool f32 = a->type == CUDA_R_32F && b->type == CUDA_R_32F && c->type == CUDA_R_32F && d->type == CUDA_R_32F;
    const bool bf16 = a->type == CUDA_R_16BF && b->type == CUDA_R_16BF && c->type == d->type;
    if (!f32 && !bf16)
        return not_emulated("the matrix types A " + std::to_string(a->type) + ", B " + std::to_string(b->type) + ", C " +
                            std::to_string(c->type) + ", D " + std::to_string(d->type) +
                            " (f32 ones, or bf16 A and B with C and D both f32 or both bf16, are)");
    if (bf16 && description.pedantic_or_fast)
        return not_emulated("a compute type other than CUBLAS_COMPUTE_32F for bf16 operands");
    constexpr uint64_t largest = 0x7fffffff;
    for (const Layout* layout : {a, b, c, d})
        if (layout->rows > largest || layout->columns > largest || static_cast<uint64_t>(layout->leading) > largest)
            return not_emulated("a dimension or leading dimension past 2^31 - 1");
    shape = Shape{static_cast<int>(m), static_cast<int>(n), static_cast<int>(k)};
    return CUBLAS_STATUS_SUCCESS;
}

uint32_t alignment_of(const void* pointer) {
    const auto address = reinterpret_cast<uintptr_t>(pointer);
    // The lowest set bit, capped at 2^31: an address on a 4 GiB boundary would otherwise truncate to 0 in 32 bits and
    // pass for unaligned.
    constexpr uintptr_t cap = uintptr_t{1} << 31;
    const uintptr_t lowest = address & (~address + 1);
    return address == 0 || lowest >= cap ? static_cast<uint32_t>(cap) : static_cast<uint32_t>(lowest);
}

} // namespace
} // namespace engine::emulator

using namespace engine::emulator;

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
    if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    if (const cublasStatus_t status = handle_creation_status(); status != CUBLAS_STATUS_SUCCESS) return status;
    *handle = new cublasLtContext();
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* handle, cublasComputeType_t compute, cudaDataType_t scale) {
    if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    const bool fp32 = compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC ||
                      compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    if (!fp32) return not_emulated("compute type " + std::to_string(compute) + " (only the fp32 ones are)");
    if (scale != CUDA_R_32F) return not_emulated("scale type " + std::to_string(scale) + " (only CUDA_R_32F is)");
    auto* description = new MatmulDescription();
    description->tf32 = compute == CUBLAS_COMPUTE_32F_FAST_TF32; // cuBLASLt has no math mode: 32F is fp32
    description->pedantic_or_fast = compute != CUBLAS_COMPUTE_32F;
    *handle = reinterpret_cast<cublasLtMatmulDesc_t>(description);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t handle) {
    delete description_of(handle);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t handle, cublasLtMatmulDescAttributes_t attribute,
                                              const void* buffer, size_t bytes) {
    MatmulDescription* description = description_of(handle);
    if (description == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    switch (attribute) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
        int32_t operation = 0;
        if (read_attribute(operation, buffer, bytes) != CUBLAS_STATUS_SUCCESS || !is_operation(operation))
            return CUBLAS_STATUS_INVALID_VALUE;
        (attribute == CUBLASLT_MATMUL_DESC_TRANSA ? description->transpose_a : description->transpose_b) =
            static_cast<cublasOperation_t>(operation);
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
        uint32_t epilogue = 0;
        if (read_attribute(epilogue, buffer, bytes) != CUBLAS_STATUS_SUCCESS) return CUBLAS_STATUS_INVALID_VALUE;
        if (epilogue != CUBLASLT_EPILOGUE_DEFAULT && epilogue != CUBLASLT_EPILOGUE_BIAS)
            return not_emulated("epilogue " + std::to_string(epilogue) + " (only DEFAULT and BIAS are)");
        description->epilogue = static_cast<cublasLtEpilogue_t>(epilogue);
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: {
        const void* bias = nullptr;
        if (read_attribute(bias, buffer, bytes) != CUBLAS_STATUS_SUCCESS) return CUBLAS_STATUS_INVALID_VALUE;
        description->bias = bias;
        return CUBLAS_STATUS_SUCCESS;
    }
    default:
        return not_emulated("matmul descriptor attribute " + std::to_string(attribute) +
                            " (only TRANSA, TRANSB, EPILOGUE and BIAS_POINTER are)");
    }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* handle, cudaDataType type, uint64_t rows,
                                          uint64_t columns, int64_t leading) {
    if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    if (type != CUDA_R_32F && type != CUDA_R_16BF)
        return not_emulated("matrix data type " + std::to_string(type) + " (only CUDA_R_32F and CUDA_R_16BF are)");
    if (leading < static_cast<int64_t>(std::max<uint64_t>(rows, 1))) return CUBLAS_STATUS_INVALID_VALUE; // column-major
    *handle = reinterpret_cast<cublasLtMatrixLayout_t>(new Layout{rows, columns, leading, type});
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t handle) {
    delete layout_of(handle);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* handle) {
    if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = reinterpret_cast<cublasLtMatmulPreference_t>(new Preference());
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t handle) {
    delete preference_of(handle);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t handle,
                                                    cublasLtMatmulPreferenceAttributes_t attribute, const void* buffer,
                                                    size_t bytes) {
    Preference* preference = preference_of(handle);
    if (preference == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    switch (attribute) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return read_attribute(preference->max_workspace_bytes, buffer, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        return read_attribute(preference->alignment[attribute - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buffer, bytes);
    default:
        return not_emulated("matmul preference attribute " + std::to_string(attribute) +
                            " (only MAX_WORKSPACE_BYTES and MIN_ALIGNMENT_{A,B,C,D}_BYTES are)");
    }
}

// One algorithm, which needs no workspace; it remembers the alignments it was chosen for, and cublasLtMatmul
// refuses pointers less aligned than that, because on a GPU the chosen kernel may need them.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t operation,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t preference, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    const MatmulDescription* description = description_of(operation);
    const Preference* wanted = preference_of(preference);
    if (description == nullptr || wanted == nullptr || requested <= 0 || results == nullptr || returned == nullptr)
        return CUBLAS_STATUS_INVALID_VALUE;
    Shape shape;
    if (const cublasStatus_t status = shape_of(*description, layout_of(a), layout_of(b), layout_of(c), layout_of(d), shape);
        status != CUBLAS_STATUS_SUCCESS)
        return status;
    results[0] = cublasLtMatmulHeuristicResult_t{};
    Algorithm algorithm{Algorithm::tag, {}};
    std::copy(std::begin(wanted->alignment), std::end(wanted->alignment), algorithm.alignment);
    std::memcpy(&results[0].algo, &algorithm, sizeof(algorithm));
    results[0].workspaceSize = 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t operation, const void* alpha, const void* a,
                              cublasLtMatrixLayout_t a_layout, const void* b, cublasLtMatrixLayout_t b_layout,
                              const void* beta, const void* c, cublasLtMatrixLayout_t c_layout, void* d,
                              cublasLtMatrixLayout_t d_layout, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
    Lock lock(device_mutex());
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    const MatmulDescription* description = description_of(operation);
    if (description == nullptr || alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    Shape shape;
    if (const cublasStatus_t status = shape_of(*description, layout_of(a_layout), layout_of(b_layout),
                                               layout_of(c_layout), layout_of(d_layout), shape);
        status != CUBLAS_STATUS_SUCCESS)
        return status;
    const float beta_value = *static_cast<const float*>(beta); // host pointer mode: read at the call
    const Layout& d_shape = *layout_of(d_layout);
    const bool c_is_d = c == d && layout_of(c_layout)->leading == d_shape.leading;
    if (beta_value != 0.0f && !c_is_d) return not_emulated("a matmul whose C is not D (with beta != 0)");
    if (description->epilogue == CUBLASLT_EPILOGUE_BIAS && description->bias == nullptr)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (algo != nullptr) {
        Algorithm algorithm;
        std::memcpy(&algorithm, algo, sizeof(algorithm));
        if (algorithm.marker != Algorithm::tag) return CUBLAS_STATUS_INVALID_VALUE;
        const void* pointers[4] = {a, b, c, d};
        const char* names[4] = {"A", "B", "C", "D"};
        for (int index = 0; index < 4; ++index) {
            if (alignment_of(pointers[index]) < algorithm.alignment[index]) {
                std::ostringstream message;
                message << "cuBLASLt: matmul operand " << names[index] << " (" << pointers[index] << ") is aligned to "
                        << alignment_of(pointers[index]) << " bytes, but its algorithm was chosen for "
                        << algorithm.alignment[index] << " (set CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_" << names[index]
                        << "_BYTES)";
                return refuse(CUBLAS_STATUS_NOT_SUPPORTED, message.str());
            }
        }
    }
    GemmArguments arguments;
    arguments.transpose_a = description->transpose_a;
    arguments.transpose_b = description->transpose_b;
    arguments.m = shape.m, arguments.n = shape.n, arguments.k = shape.k;
    arguments.alpha = *static_cast<const float*>(alpha);
    arguments.beta = beta_value;
    arguments.operand_type = layout_of(a_layout)->type, arguments.c_type = d_shape.type;
    arguments.a = a, arguments.lda = static_cast<int>(layout_of(a_layout)->leading);
    arguments.b = b, arguments.ldb = static_cast<int>(layout_of(b_layout)->leading);
    arguments.c = d, arguments.ldc = static_cast<int>(d_shape.leading);
    arguments.bias = description->epilogue == CUBLASLT_EPILOGUE_BIAS ? description->bias : nullptr;
    arguments.workspace = workspace;
    arguments.workspace_bytes = workspace_bytes;
    arguments.tf32 = description->tf32;
    arguments.call = "cublasLtMatmul";
    return enqueue_gemm(stream, arguments);
}
