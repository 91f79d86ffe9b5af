// A C interface to Chapter 10's layer, for tools/ch10_check_pytorch.py: the GPU suite loads it with
// ctypes and runs `before` and `after` on the very tensors PyTorch's module reads, then compares the
// outputs. Device pointers in, no allocation: the caller passes the workspace. Every function returns
// 0, or -1 with the reason in error (a kc::InvalidArgument's message names the rule).
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "kc/check.hpp"
#include "moe_layer.hpp"

namespace {

int fail(const std::exception& e, char* error, int error_len) {
  if (error != nullptr && error_len > 0) std::snprintf(error, static_cast<std::size_t>(error_len), "%s", e.what());
  return -1;
}

kc::ch10::MoeConfig config_of(const char* model) {
  const std::string name = model != nullptr ? model : "";
  for (const kc::ch10::MoeConfig& c : {kc::ch10::deepseek_v3(), kc::ch10::mixtral_8x7b(), kc::ch10::qwen3_30b_a3b()}) {
    if (c.name == name) return c;
  }
  throw kc::InvalidArgument("model (" + name + ") must be dsv3, mixtral or qwen3_30b_a3b");
}

}  // namespace

extern "C" {

/// Bytes of workspace the layer of @p model needs for @p tokens tokens, or -1 (see error).
long long kc_ch10_workspace_bytes(const char* model, long long tokens, char* error, int error_len) {
  try {
    return static_cast<long long>(kc::ch10::moe_workspace_bytes(config_of(model), tokens));
  } catch (const std::exception& e) {
    return fail(e, error, error_len);
  }
}

/// One forward pass of @p model's layer, `before` or `after` (@p variant), on the default stream, then
/// a synchronisation; @p ids_out (device, [T, k] int32, may be null) receives the routing's ids.
/// Weights as in moe_layer.hpp: up [E + S, 2I, H], down [E + S, H, I]; bias null for no bias.
int kc_ch10_layer(const char* model, const char* variant, long long tokens, const void* x, const void* router,
                  const void* bias, const void* up, const void* down, void* y, void* workspace,
                  long long workspace_bytes, void* ids_out, char* error, int error_len) {
  try {
    const kc::ch10::MoeConfig c = config_of(model);
    kc::ch10::MoeWeights w;
    w.router = static_cast<const __nv_bfloat16*>(router);
    w.correction_bias = static_cast<const float*>(bias);
    w.up = static_cast<const __nv_bfloat16*>(up);
    w.down = static_cast<const __nv_bfloat16*>(down);
    const auto* xx = static_cast<const __nv_bfloat16*>(x);
    auto* yy = static_cast<__nv_bfloat16*>(y);
    const auto bytes = static_cast<std::size_t>(workspace_bytes);
    const std::string v = variant != nullptr ? variant : "";
    if (v == "before") {
      kc::ch10::moe_layer_before(c, tokens, xx, w, yy, workspace, bytes);
    } else if (v == "after") {
      kc::ch10::moe_layer_after(c, tokens, xx, w, yy, workspace, bytes);
    } else {
      throw kc::InvalidArgument("variant (" + v + ") must be before or after");
    }
    if (ids_out != nullptr && tokens > 0) {
      const kc::ch10::MoeRoutingView view = kc::ch10::moe_routing_in(c, tokens, workspace);
      kc::check(
          cudaMemcpyAsync(ids_out, view.ids, static_cast<std::size_t>(tokens * c.k) * 4, cudaMemcpyDeviceToDevice));
    }
    kc::check(cudaDeviceSynchronize());
    return 0;
  } catch (const std::exception& e) {
    return fail(e, error, error_len);
  }
}

}  // extern "C"
