// The transformer's parameters: the flat buffers, the views into them, the Hugging Face parameter
// table, initialisation, and what the trainer does to them between steps.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/core/rng.h"
#include "engine/core/status.h"
#include "engine/model/transformer.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/router/router.h"

namespace moetrain {
namespace {

// Each tensor starts on a 64-byte boundary of the f32 buffer.
constexpr int64_t kAlignElements = 16;

// Where a tensor lives in the flat buffers.
struct Region {
  int64_t offset = 0;
  std::vector<int64_t> shape;
};

class Layout {
 public:
  Region Add(std::vector<int64_t> shape) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    const int64_t offset = (size_ + kAlignElements - 1) / kAlignElements * kAlignElements;
    size_ = offset + numel;
    return {offset, std::move(shape)};
  }
  int64_t size() const { return size_; }

 private:
  int64_t size_ = 0;
};

struct BlockRegions {
  Region input_norm, q_proj, k_proj, v_proj, o_proj, post_attention_norm;
  Region q_a_proj, q_a_norm, q_b_proj, kv_a_proj, kv_a_norm, kv_b_proj;  // MLA (and q_proj, o_proj)
  Region mlp_gate_up, mlp_down;                                          // dense
  Region router, expert_bias, experts_gate_up, experts_down, shared_gate_up, shared_down;  // MoE
};

void AddMlaRegions(const ModelConfig& c, Layout* layout, BlockRegions* r) {
  const MlaConfig& m = c.mla;
  const int64_t d = c.hidden_size, h = c.num_heads, q_dim = h * m.qk_head_dim();
  if (m.q_lora_rank == 0) {
    r->q_proj = layout->Add({q_dim, d});
  } else {
    r->q_a_proj = layout->Add({m.q_lora_rank, d});
    r->q_a_norm = layout->Add({m.q_lora_rank});
    r->q_b_proj = layout->Add({q_dim, m.q_lora_rank});
  }
  r->kv_a_proj = layout->Add({m.kv_lora_rank + m.qk_rope_head_dim, d});
  r->kv_a_norm = layout->Add({m.kv_lora_rank});
  r->kv_b_proj = layout->Add({h * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank});
  r->o_proj = layout->Add({d, h * m.v_head_dim});
}

}  // namespace

absl::Status Transformer::BuildParameters() {
  const ModelConfig& c = config_;
  const MoeConfig& moe = c.moe;
  const int64_t d = c.hidden_size, v = c.vocab_size, dh = c.resolved_head_dim();
  const int64_t q_dim = c.num_heads * dh, kv_dim = c.num_kv_heads * dh;
  const int64_t e = moe.num_experts, fe = moe.expert_ffn_dim;
  const int64_t local_e = num_local_experts_, first_e = first_local_expert_;
  const int64_t shared_f = moe.num_shared_experts * fe;
  const int64_t layers = c.num_layers;

  // The dense part in the order backward completes it, then the routed experts likewise (see
  // transformer.h); each stage's ranges run from the buffer's end before it to the end after it.
  Layout layout;
  grad_stages_.assign(layers + 2, {});
  const auto dense_stage = [&](int64_t stage, auto&& add_regions) {
    grad_stages_[stage].dense_begin = layout.size();
    add_regions();
    grad_stages_[stage].dense_end = layout.size();
  };
  Region lm_head, final_norm, embed;
  const int64_t blocks = c.total_blocks();  // MTP modules' blocks after the model's
  std::vector<BlockRegions> regions(blocks);
  // The regions of block l, its dense part.
  const auto add_block_regions = [&](int64_t l) {
    BlockRegions& r = regions[l];
    r.input_norm = layout.Add({d});
    if (c.is_mla()) {
      AddMlaRegions(c, &layout, &r);
    } else {
      r.q_proj = layout.Add({q_dim, d});
      r.k_proj = layout.Add({kv_dim, d});
      r.v_proj = layout.Add({kv_dim, d});
      r.o_proj = layout.Add({d, q_dim});
    }
    r.post_attention_norm = layout.Add({d});
    if (!blocks_[l].is_moe()) {
      r.mlp_gate_up = layout.Add({2 * c.ffn_dim, d});
      r.mlp_down = layout.Add({d, c.ffn_dim});
      return;
    }
    r.router = layout.Add({e, d});
    if (moe.expert_bias) r.expert_bias = layout.Add({e});
    if (shared_f > 0) {
      r.shared_gate_up = layout.Add({2 * shared_f, d});
      r.shared_down = layout.Add({d, shared_f});
    }
  };
  // An MTP module's norms and eh_proj; its block's regions follow.
  struct MtpRegions {
    Region enorm, hnorm, eh_proj, shared_norm;
  };
  std::vector<MtpRegions> mtp(c.mtp_depth);
  // Stage 0: the LM head and final norm, and the MTP modules, whose backward runs before it ends.
  dense_stage(0, [&] {
    if (!c.tie_embeddings) lm_head = layout.Add({v, d});
    final_norm = layout.Add({d});
    for (int64_t k = 0; k < c.mtp_depth; ++k) {
      mtp[k].enorm = layout.Add({d});
      mtp[k].hnorm = layout.Add({d});
      mtp[k].eh_proj = layout.Add({d, 2 * d});
      add_block_regions(layers + k);
      mtp[k].shared_norm = layout.Add({d});
    }
  });
  for (int64_t l = layers - 1; l >= 0; --l) dense_stage(layers - l, [&] { add_block_regions(l); });
  dense_stage(layers + 1, [&] { embed = layout.Add({v, d}); });
  if (c.tie_embeddings) lm_head = embed;
  dense_size_ = layout.size();
  for (int64_t stage = 0; stage < layers + 2; ++stage) {
    GradStage& s = grad_stages_[stage];
    s.expert_begin = layout.size();
    const auto add_experts = [&](int64_t l) {
      regions[l].experts_gate_up = layout.Add({local_e, 2 * fe, d});
      regions[l].experts_down = layout.Add({local_e, d, fe});
    };
    const int64_t l = layers - stage;  // the block of this stage, when it is one
    if (stage >= 1 && stage <= layers && blocks_[l].is_moe()) add_experts(l);
    if (stage == 0) {
      for (int64_t k = 0; k < c.mtp_depth; ++k) add_experts(layers + k);
    }
    s.expert_end = layout.size();
  }

  MOETRAIN_ASSIGN_OR_RETURN(masters_,
                            Tensor::Allocate(ctx_.allocator(), DType::kF32, {layout.size()}));
  MOETRAIN_ASSIGN_OR_RETURN(grads_,
                            Tensor::Allocate(ctx_.allocator(), DType::kF32, {layout.size()}));
  MOETRAIN_RETURN_IF_ERROR(ops::Fill(ctx_, masters_, 0.0f));
  MOETRAIN_RETURN_IF_ERROR(ops::Fill(ctx_, grads_, 0.0f));
  if (dtype_ != DType::kF32) {
    MOETRAIN_ASSIGN_OR_RETURN(compute_,
                              Tensor::Allocate(ctx_.allocator(), dtype_, {layout.size()}));
    MOETRAIN_RETURN_IF_ERROR(ops::Fill(ctx_, compute_, 0.0f));
  }

  // Views into the flat buffers, on their device.
  const Device device = ctx_.device();
  auto view_of = [&](const Tensor& buffer, DType dtype, const Region& r) {
    return TensorView(static_cast<char*>(buffer.view().raw()) + r.offset * DTypeSize(dtype), dtype,
                      r.shape, device);
  };
  auto master = [&](const Region& r) { return view_of(masters_, DType::kF32, r); };
  auto grad = [&](const Region& r) { return view_of(grads_, DType::kF32, r); };
  auto compute = [&](const Region& r) {
    return dtype_ == DType::kF32 ? master(r) : view_of(compute_, dtype_, r);
  };

  parameters_.clear();
  parameter_init_.clear();
  parameter_init_index_.clear();
  // The index each parameter has in the single-rank model: other ranks' experts are counted
  // without being added.
  int64_t init_index = 0;
  auto add = [&](std::string name, TensorView value, TensorView g, Init init, bool expert) {
    const bool is_bias = init == Init::kZeros;
    parameters_.push_back({.name = std::move(name),
                           .value = value,
                           .grad = g,
                           .weight_decay = init == Init::kNormal,
                           .trainable = !is_bias,
                           .expert = expert});
    parameter_init_.push_back(init);
    parameter_init_index_.push_back(init_index++);
  };
  // A whole tensor, or rows [begin, end) of a fused one.
  auto add_region = [&](std::string name, const Region& r, Init init) {
    add(std::move(name), master(r), grad(r), init, /*expert=*/false);
  };
  auto add_rows = [&](std::string name, TensorView value, TensorView g, int64_t begin, int64_t end,
                      bool expert = false) {
    add(std::move(name), value.Slice(begin, end), g.Slice(begin, end), Init::kNormal, expert);
  };

  add_region("model.embed_tokens.weight", embed, Init::kNormal);
  block_weights_.assign(blocks, {});
  block_grads_.assign(blocks, {});
  // Block l's parameters, views and names.
  const auto add_block = [&](int64_t l) {
    const BlockRegions& r = regions[l];
    const std::string prefix = absl::StrCat("model.layers.", l, ".");
    BlockWeights& w = block_weights_[l];
    BlockGrads& g = block_grads_[l];
    add_region(prefix + "input_layernorm.weight", r.input_norm, Init::kOnes);
    w.input_norm = master(r.input_norm);
    g.input_norm = grad(r.input_norm);
    // A projection (compute copy) or a norm (f32 master) of the attention.
    const auto attention = [&](const char* name, const Region& region, TensorView* weight,
                               TensorView* gradient, bool norm = false) {
      add_region(absl::StrCat(prefix, "self_attn.", name, ".weight"), region,
                 norm ? Init::kOnes : Init::kNormal);
      *weight = norm ? master(region) : compute(region);
      *gradient = grad(region);
    };
    if (c.is_mla()) {
      if (c.mla.q_lora_rank == 0) {
        attention("q_proj", r.q_proj, &w.mla.q_proj, &g.mla.q_proj);
      } else {
        attention("q_a_proj", r.q_a_proj, &w.mla.q_a_proj, &g.mla.q_a_proj);
        attention("q_a_layernorm", r.q_a_norm, &w.mla.q_a_norm, &g.mla.q_a_norm, /*norm=*/true);
        attention("q_b_proj", r.q_b_proj, &w.mla.q_b_proj, &g.mla.q_b_proj);
      }
      attention("kv_a_proj_with_mqa", r.kv_a_proj, &w.mla.kv_a_proj, &g.mla.kv_a_proj);
      attention("kv_a_layernorm", r.kv_a_norm, &w.mla.kv_a_norm, &g.mla.kv_a_norm, /*norm=*/true);
      attention("kv_b_proj", r.kv_b_proj, &w.mla.kv_b_proj, &g.mla.kv_b_proj);
      attention("o_proj", r.o_proj, &w.mla.o_proj, &g.mla.o_proj);
    } else {
      attention("q_proj", r.q_proj, &w.q_proj, &g.q_proj);
      attention("k_proj", r.k_proj, &w.k_proj, &g.k_proj);
      attention("v_proj", r.v_proj, &w.v_proj, &g.v_proj);
      attention("o_proj", r.o_proj, &w.o_proj, &g.o_proj);
    }
    add_region(prefix + "post_attention_layernorm.weight", r.post_attention_norm, Init::kOnes);
    w.post_attention_norm = master(r.post_attention_norm);
    g.post_attention_norm = grad(r.post_attention_norm);

    if (!blocks_[l].is_moe()) {
      const int64_t f = c.ffn_dim;
      add_rows(prefix + "mlp.gate_proj.weight", master(r.mlp_gate_up), grad(r.mlp_gate_up), 0, f);
      add_rows(prefix + "mlp.up_proj.weight", master(r.mlp_gate_up), grad(r.mlp_gate_up), f, 2 * f);
      add_region(prefix + "mlp.down_proj.weight", r.mlp_down, Init::kNormal);
      w.mlp_gate_up = compute(r.mlp_gate_up);
      w.mlp_down = compute(r.mlp_down);
      g.mlp_gate_up = grad(r.mlp_gate_up);
      g.mlp_down = grad(r.mlp_down);
      return;
    }
    // The router and the bias are read in f32; the experts through their compute copies.
    add_region(prefix + "mlp.gate.weight", r.router, Init::kNormal);
    w.moe.router = master(r.router);
    g.moe.router = grad(r.router);
    if (moe.expert_bias) {
      add_region(prefix + "mlp.gate.e_score_correction_bias", r.expert_bias, Init::kZeros);
      w.moe.expert_bias = master(r.expert_bias);
    }
    // This rank's experts are fused (E/ep, 2F, D) and (E/ep, D, F) for the grouped GEMM; each
    // expert's gate/up/down are contiguous blocks of them.
    const TensorView gate_up = master(r.experts_gate_up), gate_up_grad = grad(r.experts_gate_up);
    const TensorView down = master(r.experts_down), down_grad = grad(r.experts_down);
    init_index += 3 * first_e;  // gate, up and down of each expert before this rank's
    for (int64_t x = 0; x < local_e; ++x) {
      const std::string expert = absl::StrCat(prefix, "mlp.experts.", first_e + x, ".");
      add_rows(expert + "gate_proj.weight", gate_up.Select(x), gate_up_grad.Select(x), 0, fe,
               /*expert=*/true);
      add_rows(expert + "up_proj.weight", gate_up.Select(x), gate_up_grad.Select(x), fe, 2 * fe,
               /*expert=*/true);
      add(expert + "down_proj.weight", down.Select(x), down_grad.Select(x), Init::kNormal,
          /*expert=*/true);
    }
    init_index += 3 * (e - first_e - local_e);  // and after it
    w.moe.expert_gate_up = compute(r.experts_gate_up);
    w.moe.expert_down = compute(r.experts_down);
    g.moe.expert_gate_up = gate_up_grad;
    g.moe.expert_down = down_grad;
    if (shared_f > 0) {
      const std::string shared = prefix + "mlp.shared_experts.";
      add_rows(shared + "gate_proj.weight", master(r.shared_gate_up), grad(r.shared_gate_up), 0,
               shared_f);
      add_rows(shared + "up_proj.weight", master(r.shared_gate_up), grad(r.shared_gate_up),
               shared_f, 2 * shared_f);
      add_region(shared + "down_proj.weight", r.shared_down, Init::kNormal);
      w.moe.shared_gate_up = compute(r.shared_gate_up);
      w.moe.shared_down = compute(r.shared_down);
      g.moe.shared_gate_up = grad(r.shared_gate_up);
      g.moe.shared_down = grad(r.shared_down);
    }
  };
  for (int64_t l = 0; l < layers; ++l) add_block(l);
  add_region("model.norm.weight", final_norm, Init::kOnes);
  if (!c.tie_embeddings) add_region("lm_head.weight", lm_head, Init::kNormal);
  // The MTP modules last, under Hugging Face's DeepSeek-V3 names (model.layers.{L + k}); they
  // share the embedding and the LM head.
  mtp_weights_.assign(c.mtp_depth, {});
  mtp_grads_.assign(c.mtp_depth, {});
  for (int64_t k = 0; k < c.mtp_depth; ++k) {
    const std::string prefix = absl::StrCat("model.layers.", layers + k, ".");
    const MtpRegions& r = mtp[k];
    add_region(prefix + "enorm.weight", r.enorm, Init::kOnes);
    add_region(prefix + "hnorm.weight", r.hnorm, Init::kOnes);
    add_region(prefix + "eh_proj.weight", r.eh_proj, Init::kNormal);
    add_block(layers + k);
    add_region(prefix + "shared_head.norm.weight", r.shared_norm, Init::kOnes);
    mtp_weights_[k] = {.enorm = master(r.enorm),
                       .hnorm = master(r.hnorm),
                       .eh_proj = compute(r.eh_proj),
                       .shared_norm = master(r.shared_norm)};
    mtp_grads_[k] = {.enorm = grad(r.enorm),
                     .hnorm = grad(r.hnorm),
                     .eh_proj = grad(r.eh_proj),
                     .shared_norm = grad(r.shared_norm)};
  }

  embed_ = master(embed);
  embed_grad_ = grad(embed);
  final_norm_ = master(final_norm);
  final_norm_grad_ = grad(final_norm);
  lm_head_ = compute(lm_head);
  lm_head_grad_ = grad(lm_head);
  return absl::OkStatus();
}

absl::Status Transformer::Initialize(uint64_t seed) {
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const TensorView value = parameters_[i].value;
    switch (parameter_init_[i]) {
      case Init::kOnes:
        MOETRAIN_RETURN_IF_ERROR(ops::Fill(ctx_, value, 1.0f));
        break;
      case Init::kZeros:
        MOETRAIN_RETURN_IF_ERROR(ops::Fill(ctx_, value, 0.0f));
        break;
      case Init::kNormal: {
        const Rng rng(seed, /*step=*/parameter_init_index_[i], /*rank=*/0, kInitStream);
        MOETRAIN_RETURN_IF_ERROR(ops::FillNormal(ctx_, value, rng, 0.0f, config_.init_std));
        break;
      }
    }
  }
  return SyncComputeWeights();
}

absl::Status Transformer::SyncComputeWeights() {
  if (dtype_ == DType::kF32) return absl::OkStatus();
  // Norms, routers and biases are converted too, unused: one pass over one buffer is simplest.
  return ops::ConvertTensor(ctx_, masters_, compute_);
}

absl::Status Transformer::ZeroGrads() { return ops::Fill(ctx_, grads_, 0.0f); }

absl::Status Transformer::UpdateExpertBiases(
    absl::Span<const std::vector<int64_t>> tokens_per_expert) {
  if (!config_.moe.expert_bias) return absl::OkStatus();
  if (static_cast<int64_t>(tokens_per_expert.size()) != num_moe_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("tokens_per_expert: ", tokens_per_expert.size(),
                                                   " layers given, the model has ",
                                                   num_moe_layers(), " MoE layers"));
  }
  const int64_t e = config_.moe.num_experts;
  MOETRAIN_ASSIGN_OR_RETURN(TensorView counts, workspace_.Get(kBiasCounts, DType::kI64, {e}));
  for (int64_t j = 0; j < num_moe_layers(); ++j) {
    const int64_t layer = config_.first_dense_layers + j;
    if (static_cast<int64_t>(tokens_per_expert[j].size()) != e) {
      return absl::InvalidArgumentError(absl::StrCat("tokens_per_expert of MoE layer ", layer, ": ",
                                                     tokens_per_expert[j].size(), " counts for ", e,
                                                     " experts"));
    }
    // The step's counts, summed over the ranks on the host, go to the device of the bias
    // (CopyTensor only reads its source).
    const TensorView host_counts(const_cast<int64_t*>(tokens_per_expert[j].data()), DType::kI64,
                                 {e});
    MOETRAIN_RETURN_IF_ERROR(ops::CopyTensor(ctx_, host_counts, counts));
    const absl::Status status = ops::UpdateExpertBias(
        ctx_, counts, config_.moe.expert_bias_update_rate, block_weights_[layer].moe.expert_bias);
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("MoE layer ", layer, ": ", status.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace moetrain
