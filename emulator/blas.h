// Inside the emulator: the one GEMM (f32, or bf16 operands with an f32 or bf16 C, computed in f32) that the emulated cuBLAS (cublas.cpp) and cuBLASLt (cublaslt.cpp)
// both queue, so that argument checks, operand extents, race registration and the CBLAS product exist once.
#pragma once

#include <cstddef>
#include <string>

#include "emulator/device.h"

namespace engine::emulator {

// Column-major C = alpha·op(A)·op(B) + beta·C (+ bias along C's rows), batch by batch, as cuBLAS defines it.
struct GemmArguments {
    cublasOperation_t transpose_a = CUBLAS_OP_N, transpose_b = CUBLAS_OP_N;
    int m = 0, n = 0, k = 0;
    float alpha = 1.0f, beta = 0.0f; // read at the call (host pointer mode)
    // CUDA_R_32F or CUDA_R_16BF: of A and B together, and of C together with the bias (cuBLASLt's default
    // bias type is D's). A bf16 C is C = round(alpha·AB + beta·C + bias) with the sum in f32: one rounding.
    cudaDataType operand_type = CUDA_R_32F, c_type = CUDA_R_32F;
    const void* a = nullptr;
    int lda = 0;
    long long stride_a = 0; // elements between batches
    const void* b = nullptr;
    int ldb = 0;
    long long stride_b = 0;
    void* c = nullptr;
    int ldc = 0;
    long long stride_c = 0;
    int batch_count = 1;
    const void* bias = nullptr; // m values (c_type) added to every column after the product (cuBLASLt's BIAS epilogue)
    void* workspace = nullptr;   // the library may write it: registered as a write for the race check
    size_t workspace_bytes = 0;
    bool tf32 = false; // f32 operands rounded to TF32 first
    const char* call = "";
};

// Checks the dimensions (CUBLAS_STATUS_INVALID_VALUE as cuBLAS answers), that every operand lies inside one
// device allocation (a fault naming the operand otherwise), and queues the product on `stream`.
cublasStatus_t enqueue_gemm(cudaStream_t stream, const GemmArguments& arguments);

// A cuBLAS or cuBLASLt handle needs the device: CUBLAS_STATUS_NOT_INITIALIZED without one, as the libraries
// answer (CUDA_VISIBLE_DEVICES can hide it).
cublasStatus_t handle_creation_status();

// Prints a refusal of an unemulated library feature and keeps it for emulator::last_refusal(); returns
// `status`, so a refusing entry point can `return refuse(...)`.
cublasStatus_t refuse(cublasStatus_t status, const std::string& message);

} // namespace engine::emulator
