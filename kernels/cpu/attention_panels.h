// How the f32 attention kernels (attention_forward.cpp, attention_backward.cpp) cut their work for the BLAS: query
// panels per (batch, head) block, and every product into pieces that OpenBLAS runs on the calling thread.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cstdint>

namespace engine::kernels::cpu {

// OpenBLAS (Debian's pthread build, 0.3.21) runs an sgemm on its own threads when m·n·k exceeds 65536 ·
// OPENBLAS_GEMM_MULTITHREAD_THRESHOLD (4 in openblas_config.h): 2^18. Called from an OpenMP thread of the
// block loop, such a product starts OpenBLAS's workers beside OpenMP's on the same cores and the two pools wait on
// each other: measured 43x slower at GPT-2 124M's shape (188 ms against 4.4 ms a forward, 2 cores). Running the
// blocks one after the other and letting OpenBLAS thread each product instead was 2.5x slower than the blocks on
// OpenMP threads with single-threaded products (the softmax between the products stays on one core). So every
// product is cut into pieces of at most 2^18 multiply-adds. Another BLAS, or another threshold, changes only the
// speed: the pieces are a function of the shape alone, so the results are the same for any thread count.
inline constexpr int64_t blas_single_thread_work = int64_t(1) << 18;

// Queries per panel: a panel's products use keys 0..(its last query) only, so smaller panels skip more of the
// masked triangle (5/8 of the square at T = 128 with 32 rows, 17/32 at T = 1024 with 64) and larger ones make
// larger products.
inline int attention_panel_rows(int T) { return std::min(T, T <= 256 ? 32 : 64); }

// c (m,n), leading dimension ldc, = alpha·op(a)·op(b) + beta·c, as row-major cblas_sgemm, in pieces of at most
// blas_single_thread_work multiply-adds: K in slices of at most 128 (the first with beta, the rest adding with
// beta = 1: the only split that changes an element's arithmetic, a fixed one), then M and N in tiles of at least
// 16 rows (the microkernel's). Head sizes up to 128 keep S = Q K^T whole along K. k >= 1 in every call (a head
// size, a panel's rows or its keys), so the BLAS never sees the k = 0 some implementations reject.
inline void sgemm_in_pieces(CBLAS_TRANSPOSE op_a, CBLAS_TRANSPOSE op_b, int m, int n, int k, float alpha,
                            const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
    if (m <= 0 || n <= 0) return;
    const int k_slice = std::max(1, std::min(k, 128));
    const int64_t tile = blas_single_thread_work / k_slice; // multiply-adds per piece over k_slice: m·n
    const int m_tile = int(std::min<int64_t>(m, std::max<int64_t>(16, tile / std::min(n, 64))));
    const int n_tile = int(std::min<int64_t>(n, std::max<int64_t>(1, tile / m_tile)));
    // Element (i, l) of op(a) and (l, j) of op(b) in row-major storage.
    auto a_at = [&](int i, int l) { return op_a == CblasNoTrans ? a + int64_t(i) * lda + l : a + int64_t(l) * lda + i; };
    auto b_at = [&](int l, int j) { return op_b == CblasNoTrans ? b + int64_t(l) * ldb + j : b + int64_t(j) * ldb + l; };
    for (int i = 0; i < m; i += m_tile) {
        const int rows = std::min(m_tile, m - i);
        for (int j = 0; j < n; j += n_tile) {
            const int columns = std::min(n_tile, n - j);
            float* c_tile = c + int64_t(i) * ldc + j;
            for (int l = 0; l < k; l += k_slice) {
                cblas_sgemm(CblasRowMajor, op_a, op_b, rows, columns, std::min(k_slice, k - l), alpha, a_at(i, l), lda,
                            b_at(l, j), ldb, l == 0 ? beta : 1.0f, c_tile, ldc);
            }
        }
    }
}

} // namespace engine::kernels::cpu
