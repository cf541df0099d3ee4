// Member LayerNorm for snens: layer norm over the last D features of each row, with the affine
// of the row's member. Rows are member-major: row r of R belongs to member r / (R / M).
//
//   forward:  y = (x - mean) * rstd * weight[m] + bias[m],  rstd = 1 / sqrt(var + eps)
//   backward: a = g * weight[m];  gx = rstd * (a - mean(a) - xhat * mean(a * xhat))
//             gweight[m] = sum over the member's rows of g * xhat,  gbias[m] = sum of g
//
// One pass writes each member's rows straight into one output (no concatenation), which no
// native kernel does: ATen's layer norm takes one affine for all rows. Built on first use by
// snens.nn.fused with -O3 -march=native; float32 and float64 on contiguous CPU tensors.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <tuple>
#include <vector>

namespace {

template <typename T>
void forward_kernel(const T* x, const T* w, const T* b, T* y, T* mean_out, T* rstd_out, int64_t R,
                    int64_t D, int64_t rows_per_member, double eps) {
  at::parallel_for(0, R, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * D;
      T* yr = y + r * D;
      const int64_t m = r / rows_per_member;
      const T* wm = w + m * D;
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t d = 0; d < D; ++d) sum += xr[d];
      const T mu = sum / static_cast<T>(D);
      T sq = 0;  // two passes over a row that sits in L1: the variance without cancellation
#pragma omp simd reduction(+ : sq)
      for (int64_t d = 0; d < D; ++d) {
        const T c = xr[d] - mu;
        sq += c * c;
      }
      const T rstd = static_cast<T>(1) / std::sqrt(sq / static_cast<T>(D) + static_cast<T>(eps));
      if (b != nullptr) {
        const T* bm = b + m * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) yr[d] = (xr[d] - mu) * rstd * wm[d] + bm[d];
      } else {
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) yr[d] = (xr[d] - mu) * rstd * wm[d];
      }
      mean_out[r] = mu;
      rstd_out[r] = rstd;
    }
  });
}

template <typename T>
void backward_kernel(const T* g, const T* x, const T* mean, const T* rstd, const T* w, T* gx,
                     T* gw, T* gb, int64_t R, int64_t D, int64_t M, int64_t rows_per_member) {
  // per-thread partial sums of the parameter gradients, added in thread order: deterministic
  // for a given number of threads
  const int64_t threads = at::get_num_threads();
  std::vector<T> part_w(threads * M * D, T(0));
  std::vector<T> part_b(threads * M * D, T(0));
  at::parallel_for(0, R, 16, [&](int64_t begin, int64_t end) {
    const int64_t t = at::get_thread_num();
    for (int64_t r = begin; r < end; ++r) {
      const T* gr = g + r * D;
      const T* xr = x + r * D;
      T* gxr = gx + r * D;
      const int64_t m = r / rows_per_member;
      const T* wm = w + m * D;
      T* pw = part_w.data() + (t * M + m) * D;
      T* pb = part_b.data() + (t * M + m) * D;
      const T mu = mean[r];
      const T rs = rstd[r];
      T sum_a = 0, sum_ax = 0;
#pragma omp simd reduction(+ : sum_a, sum_ax)
      for (int64_t d = 0; d < D; ++d) {
        const T xhat = (xr[d] - mu) * rs;
        const T a = gr[d] * wm[d];
        sum_a += a;
        sum_ax += a * xhat;
        pw[d] += gr[d] * xhat;
        pb[d] += gr[d];
      }
      const T c1 = sum_a / static_cast<T>(D);
      const T c2 = sum_ax / static_cast<T>(D);
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) {
        const T xhat = (xr[d] - mu) * rs;
        gxr[d] = rs * (gr[d] * wm[d] - c1 - xhat * c2);
      }
    }
  });
  for (int64_t t = 0; t < threads; ++t) {
    const T* pw = part_w.data() + t * M * D;
    const T* pb = part_b.data() + t * M * D;
    for (int64_t i = 0; i < M * D; ++i) {
      gw[i] += pw[i];
      gb[i] += pb[i];
    }
  }
}

void check(const at::Tensor& x, const at::Tensor& w, int64_t M) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "member_layer_norm: CPU tensors only");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), "member_layer_norm: contiguous tensors only");
  TORCH_CHECK(w.dim() == 2 && w.size(0) == M, "member_layer_norm: weight must be (M, D)");
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "member_layer_norm: x and weight dtypes differ");
  TORCH_CHECK(w.size(1) > 0 && x.numel() % (M * w.size(1)) == 0,
              "member_layer_norm: x must hold M * rows * D elements");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> member_layer_norm_forward(
    const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    int64_t M, double eps) {
  check(x, weight, M);
  if (bias.has_value()) {
    TORCH_CHECK(bias->sizes() == weight.sizes() && bias->is_contiguous() &&
                    bias->scalar_type() == weight.scalar_type(),
                "member_layer_norm: bias must match weight");
  }
  const int64_t D = weight.size(1);
  const int64_t R = x.numel() / D;
  at::Tensor y = at::empty_like(x);
  at::Tensor mean = at::empty({R}, x.options());
  at::Tensor rstd = at::empty({R}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "member_layer_norm_forward", [&] {
    forward_kernel<scalar_t>(x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(),
                             bias.has_value() ? bias->data_ptr<scalar_t>() : nullptr,
                             y.data_ptr<scalar_t>(), mean.data_ptr<scalar_t>(),
                             rstd.data_ptr<scalar_t>(), R, D, R / M, eps);
  });
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> member_layer_norm_backward(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& mean, const at::Tensor& rstd,
    const at::Tensor& weight, int64_t M) {
  check(x, weight, M);
  TORCH_CHECK(grad.sizes() == x.sizes() && grad.is_contiguous() &&
                  grad.scalar_type() == x.scalar_type(),
              "member_layer_norm: grad must match x");
  const int64_t D = weight.size(1);
  const int64_t R = x.numel() / D;
  at::Tensor gx = at::empty_like(x);
  at::Tensor gw = at::zeros_like(weight);
  at::Tensor gb = at::zeros_like(weight);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "member_layer_norm_backward", [&] {
    backward_kernel<scalar_t>(grad.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                              mean.data_ptr<scalar_t>(), rstd.data_ptr<scalar_t>(),
                              weight.data_ptr<scalar_t>(), gx.data_ptr<scalar_t>(),
                              gw.data_ptr<scalar_t>(), gb.data_ptr<scalar_t>(), R, D, M, R / M);
  });
  return {gx, gw, gb};
}

}  // namespace

TORCH_LIBRARY(snens_fused, m) {
  m.def("member_layer_norm_forward(Tensor x, Tensor weight, Tensor? bias, int M, float eps)"
        " -> (Tensor, Tensor, Tensor)",
        &member_layer_norm_forward);
  m.def("member_layer_norm_backward(Tensor grad, Tensor x, Tensor mean, Tensor rstd,"
        " Tensor weight, int M) -> (Tensor, Tensor, Tensor)",
        &member_layer_norm_backward);
}
