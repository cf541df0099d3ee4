// Member BatchNorm for snens: batch norm of each member's own rows, written into one output.
// Input x (M·B, C, S) contiguous (S = the product of the spatial sizes, 1 for (N, C) inputs);
// member m owns rows [m·B, (m+1)·B); statistics, running statistics and affine are per
// (member, channel), all (M, C).
//
//   training:  mean, var over the member's (B, S) values of a channel (biased var normalizes;
//              the running var takes the unbiased one, as torch.nn.BatchNorm does)
//   forward:   y = (x - mean) * invstd * weight + bias,  invstd = 1 / sqrt(var + eps)
//   backward:  gx = (g - sum(g)/n - (x - mean) * invstd² * sum(g·(x - mean))/n) * invstd * weight
//              gweight = sum(g·(x - mean)) * invstd,  gbias = sum(g)
//   eval:      y = x * alpha + beta,  alpha = weight / sqrt(running_var + eps),
//              beta = bias - running_mean * alpha;  gx = g * alpha
//
// One call covers every member (no per-member kernel calls on quarter-size tensors) and the
// backward writes the input gradient in place of the per-member copies the native backward
// needs. Built with the LayerNorm kernel by snens.nn.fused; float32/float64, CPU.

#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <tuple>

namespace {

template <typename T>
void forward_kernel(const T* x, const T* w, const T* b, T* y, T* save_mean, T* save_invstd,
                    T* running_mean, T* running_var, int64_t M, int64_t B, int64_t C, int64_t S,
                    bool training, double momentum, double eps) {
  const int64_t n = B * S;
  at::parallel_for(0, M * C, 1, [&](int64_t begin, int64_t end) {
    for (int64_t mc = begin; mc < end; ++mc) {
      const int64_t m = mc / C, c = mc % C;
      // statistics in the CPU accumulation type (double), as ATen's batch norm computes them
      using A = at::acc_type<T, false>;
      A mean, invstd;
      if (training) {
        A sum = 0;
        for (int64_t i = 0; i < B; ++i) {
          const T* xs = x + ((m * B + i) * C + c) * S;
#pragma omp simd reduction(+ : sum)
          for (int64_t s = 0; s < S; ++s) sum += static_cast<A>(xs[s]);
        }
        mean = sum / static_cast<A>(n);
        A sq = 0;
        for (int64_t i = 0; i < B; ++i) {
          const T* xs = x + ((m * B + i) * C + c) * S;
#pragma omp simd reduction(+ : sq)
          for (int64_t s = 0; s < S; ++s) {
            const A d = static_cast<A>(xs[s]) - mean;
            sq += d * d;
          }
        }
        invstd = 1 / std::sqrt(sq / static_cast<A>(n) + eps);
        if (running_mean != nullptr) {
          const A unbiased = sq / static_cast<A>(n - 1);
          running_mean[mc] = static_cast<T>((1 - momentum) * running_mean[mc] + momentum * mean);
          running_var[mc] = static_cast<T>((1 - momentum) * running_var[mc] + momentum * unbiased);
        }
      } else {
        mean = running_mean[mc];
        invstd = 1 / std::sqrt(static_cast<A>(running_var[mc]) + eps);
      }
      // the linear terms from the rounded statistics, as ATen forms them, so that a member's
      // output is the plain layer's to the last bit wherever the statistics round alike
      const T mean_t = static_cast<T>(mean);
      const T invstd_t = static_cast<T>(invstd);
      save_mean[mc] = mean_t;
      save_invstd[mc] = invstd_t;
      const T alpha = invstd_t * w[mc];
      const T beta = b[mc] - mean_t * alpha;
      for (int64_t i = 0; i < B; ++i) {
        const int64_t offset = ((m * B + i) * C + c) * S;
        const T* xs = x + offset;
        T* ys = y + offset;
#pragma omp simd
        for (int64_t s = 0; s < S; ++s) ys[s] = xs[s] * alpha + beta;
      }
    }
  });
}

template <typename T>
void backward_kernel(const T* g, const T* x, const T* w, const T* save_mean,
                     const T* save_invstd, T* gx, T* gw, T* gb, int64_t M, int64_t B, int64_t C,
                     int64_t S, bool training) {
  const int64_t n = B * S;
  at::parallel_for(0, M * C, 1, [&](int64_t begin, int64_t end) {
    for (int64_t mc = begin; mc < end; ++mc) {
      const int64_t m = mc / C, c = mc % C;
      using A = at::acc_type<T, false>;
      const A mean = save_mean[mc], invstd = save_invstd[mc];
      A sum_g = 0, sum_gd = 0;
      for (int64_t i = 0; i < B; ++i) {
        const int64_t offset = ((m * B + i) * C + c) * S;
        const T* gs = g + offset;
        const T* xs = x + offset;
#pragma omp simd reduction(+ : sum_g, sum_gd)
        for (int64_t s = 0; s < S; ++s) {
          sum_g += static_cast<A>(gs[s]);
          sum_gd += static_cast<A>(gs[s]) * (static_cast<A>(xs[s]) - mean);
        }
      }
      gw[mc] = static_cast<T>(sum_gd * invstd);
      gb[mc] = static_cast<T>(sum_g);
      if (gx == nullptr) continue;
      const T scale = static_cast<T>(invstd * w[mc]);
      const T mean_t = static_cast<T>(mean);
      if (training) {
        const T k = static_cast<T>(invstd * invstd * sum_gd / static_cast<A>(n));
        const T g_mean = static_cast<T>(sum_g / static_cast<A>(n));
        for (int64_t i = 0; i < B; ++i) {
          const int64_t offset = ((m * B + i) * C + c) * S;
          const T* gs = g + offset;
          const T* xs = x + offset;
          T* out = gx + offset;
#pragma omp simd
          for (int64_t s = 0; s < S; ++s) out[s] = (gs[s] - g_mean - (xs[s] - mean_t) * k) * scale;
        }
      } else {
        for (int64_t i = 0; i < B; ++i) {
          const int64_t offset = ((m * B + i) * C + c) * S;
          const T* gs = g + offset;
          T* out = gx + offset;
#pragma omp simd
          for (int64_t s = 0; s < S; ++s) out[s] = gs[s] * scale;
        }
      }
    }
  });
}

void check(const at::Tensor& x, const at::Tensor& w, int64_t M) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "member_batch_norm: CPU tensors only");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), "member_batch_norm: contiguous tensors only");
  TORCH_CHECK(x.dim() >= 2 && w.dim() == 2 && w.size(0) == M && w.size(1) == x.size(1),
              "member_batch_norm: x must be (M·B, C, …) and weight (M, C)");
  TORCH_CHECK(x.size(0) % M == 0, "member_batch_norm: rows must be a multiple of M");
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "member_batch_norm: x and weight dtypes differ");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> member_batch_norm_forward(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    bool training, double momentum, double eps, int64_t M) {
  check(x, weight, M);
  TORCH_CHECK(bias.sizes() == weight.sizes() && bias.is_contiguous() &&
                  bias.scalar_type() == weight.scalar_type(),
              "member_batch_norm: bias must match weight");
  const bool running = running_mean.has_value();
  TORCH_CHECK(running == running_var.has_value(), "member_batch_norm: both running stats or none");
  if (running) {
    for (const at::Tensor* t : {&*running_mean, &*running_var}) {
      TORCH_CHECK(t->sizes() == weight.sizes() && t->is_contiguous() &&
                      t->scalar_type() == weight.scalar_type(),
                  "member_batch_norm: running stats must be (M, C) like weight");
    }
  }
  TORCH_CHECK(training || running, "member_batch_norm: eval needs running stats");
  const int64_t C = x.size(1);
  const int64_t B = x.size(0) / M;
  const int64_t S = x.numel() / (x.size(0) * C);
  TORCH_CHECK(!training || B * S > 1, "member_batch_norm: more than 1 value per channel needed");
  at::Tensor y = at::empty_like(x);
  at::Tensor save_mean = at::empty_like(weight);
  at::Tensor save_invstd = at::empty_like(weight);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "member_batch_norm_forward", [&] {
    forward_kernel<scalar_t>(
        x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), bias.data_ptr<scalar_t>(),
        y.data_ptr<scalar_t>(), save_mean.data_ptr<scalar_t>(), save_invstd.data_ptr<scalar_t>(),
        running ? running_mean->data_ptr<scalar_t>() : nullptr,
        running ? running_var->data_ptr<scalar_t>() : nullptr, M, B, C, S, training, momentum,
        eps);
  });
  return {y, save_mean, save_invstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> member_batch_norm_backward(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight,
    const at::Tensor& save_mean, const at::Tensor& save_invstd, bool training, bool input_grad,
    int64_t M) {
  check(x, weight, M);
  TORCH_CHECK(grad.sizes() == x.sizes() && grad.is_contiguous() &&
                  grad.scalar_type() == x.scalar_type(),
              "member_batch_norm: grad must match x");
  const int64_t C = x.size(1);
  const int64_t B = x.size(0) / M;
  const int64_t S = x.numel() / (x.size(0) * C);
  at::Tensor gx = input_grad ? at::empty_like(x) : at::empty({0}, x.options());
  at::Tensor gw = at::empty_like(weight);
  at::Tensor gb = at::empty_like(weight);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "member_batch_norm_backward", [&] {
    backward_kernel<scalar_t>(grad.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                              weight.data_ptr<scalar_t>(), save_mean.data_ptr<scalar_t>(),
                              save_invstd.data_ptr<scalar_t>(),
                              input_grad ? gx.data_ptr<scalar_t>() : nullptr,
                              gw.data_ptr<scalar_t>(), gb.data_ptr<scalar_t>(), M, B, C, S,
                              training);
  });
  return {gx, gw, gb};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(snens_fused, m) {
  m.def("member_batch_norm_forward(Tensor x, Tensor weight, Tensor bias, Tensor? running_mean,"
        " Tensor? running_var, bool training, float momentum, float eps, int M)"
        " -> (Tensor, Tensor, Tensor)",
        &member_batch_norm_forward);
  m.def("member_batch_norm_backward(Tensor grad, Tensor x, Tensor weight, Tensor save_mean,"
        " Tensor save_invstd, bool training, bool input_grad, int M) -> (Tensor, Tensor, Tensor)",
        &member_batch_norm_backward);
}
