/* config.c - config.json of the DeepSeek-V4 family: parsing with the
 * reference's defaults, the checks of what tide supports, the per-layer
 * compress ratio, and the tensor inventory a config implies (doc 1.6). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>

#include "ckpt_internal.h"

#define CFGF "%.400s"

static void set_str(char *dst, size_t cap, const char *s) { snprintf(dst, cap, "%s", s); }

void tide_config_defaults(tide_config *c) {
  if (!c) return;
  memset(c, 0, sizeof *c);
  /* DeepSeek's reference (inference/model.py ModelArgs) = the Flash values */
  set_str(c->model_type, sizeof c->model_type, "deepseek_v4");
  set_str(c->architecture, sizeof c->architecture, "DeepseekV4ForCausalLM");
  set_str(c->torch_dtype, sizeof c->torch_dtype, "bfloat16");
  set_str(c->hidden_act, sizeof c->hidden_act, "silu");
  set_str(c->scoring_func, sizeof c->scoring_func, "sqrtsoftplus");
  set_str(c->topk_method, sizeof c->topk_method, "noaux_tc");
  set_str(c->rope_scaling_type, sizeof c->rope_scaling_type, "yarn");
  c->vocab_size = 129280;
  c->hidden_size = 4096;
  c->max_position_embeddings = 1048576;
  c->bos_token_id = 0;
  c->eos_token_id = 1;
  c->num_hidden_layers = 43;
  c->num_attention_heads = 64;
  c->num_key_value_heads = 1;
  c->head_dim = 512;
  c->qk_rope_head_dim = 64;
  c->q_lora_rank = 1024;
  c->o_lora_rank = 1024;
  c->o_groups = 8;
  c->sliding_window = 128;
  c->index_n_heads = 64;
  c->index_head_dim = 128;
  c->index_topk = 512;
  c->n_routed_experts = 256;
  c->num_experts_per_tok = 6;
  c->n_shared_experts = 1;
  c->moe_intermediate_size = 2048;
  c->scoring = TIDE_SCORING_SQRTSOFTPLUS;
  c->num_hash_layers = 3;
  c->hc_mult = 4;
  c->hc_sinkhorn_iters = 20;
  c->num_nextn_predict_layers = 1;
  c->weight_block_size[0] = c->weight_block_size[1] = 128;
  c->linear_format = TIDE_FMT_BF16;
  c->expert_format = TIDE_FMT_BF16;
  c->norm_topk_prob = 1;
  c->tie_word_embeddings = 0;
  c->attention_bias = 0;
  c->rope_scaling = 1;
  c->rope_theta = 10000.0;
  c->compress_rope_theta = 160000.0;
  c->rope_factor = 16.0;
  c->rope_original_max_position_embeddings = 65536.0;
  c->rope_beta_fast = 32.0;
  c->rope_beta_slow = 1.0;
  c->routed_scaling_factor = 1.5;
  c->swiglu_limit = 10.0;
  c->hc_eps = 1e-6;
  c->rms_norm_eps = 1e-6;
  static const int32_t dflt_ratios[8] = {0, 0, 4, 128, 4, 128, 4, 0};
  c->n_compress_ratios = 8;
  memcpy(c->compress_ratios, dflt_ratios, sizeof dflt_ratios);
}

/* ---- parsing ---- */
typedef struct {
  const char *path;
  const char *where;   /* "" or "rope_scaling." for nested objects */
} pctx;

static const char *type_name(const cJSON *v) {
  if (cJSON_IsNull(v)) return "null";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsArray(v)) return "an array";
  return "an object";
}

/* A present, non-null field, else NULL (keep the default). */
static const cJSON *field(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return (v && !cJSON_IsNull(v)) ? v : NULL;
}

static int get_i64(const pctx *p, const cJSON *o, const char *k, int64_t lo, int64_t hi, int64_t *dst) {
  const cJSON *v = field(o, k);
  if (!v) return TIDE_OK;
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
    return TIDE_ERR(TIDE_E_FORMAT, CFGF ": field '%s%s' must be an integer, got %s", p->path, p->where, k,
                    cJSON_IsNumber(v) ? "a fraction" : type_name(v));
  if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
    return TIDE_ERR(TIDE_E_UNSUPPORTED, CFGF ": field '%s%s' = %.17g is outside %lld..%lld", p->path, p->where, k,
                    v->valuedouble, (long long)lo, (long long)hi);
  *dst = (int64_t)v->valuedouble;
  return TIDE_OK;
}

static int get_i32(const pctx *p, const cJSON *o, const char *k, int32_t *dst) {
  int64_t v = *dst;
  TIDE_CHECK(get_i64(p, o, k, INT32_MIN, INT32_MAX, &v));
  *dst = (int32_t)v;
  return TIDE_OK;
}

static int get_f64(const pctx *p, const cJSON *o, const char *k, double *dst) {
  const cJSON *v = field(o, k);
  if (!v) return TIDE_OK;
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
    return TIDE_ERR(TIDE_E_FORMAT, CFGF ": field '%s%s' must be a number, got %s", p->path, p->where, k, type_name(v));
  *dst = v->valuedouble;
  return TIDE_OK;
}

static int get_bool(const pctx *p, const cJSON *o, const char *k, _Bool *dst) {
  const cJSON *v = field(o, k);
  if (!v) return TIDE_OK;
  if (!cJSON_IsBool(v))
    return TIDE_ERR(TIDE_E_FORMAT, CFGF ": field '%s%s' must be true or false, got %s", p->path, p->where, k,
                    type_name(v));
  *dst = cJSON_IsTrue(v) ? 1 : 0;
  return TIDE_OK;
}

static int get_str(const pctx *p, const cJSON *o, const char *k, char *dst, size_t cap) {
  const cJSON *v = field(o, k);
  if (!v) return TIDE_OK;
  if (!cJSON_IsString(v))
    return TIDE_ERR(TIDE_E_FORMAT, CFGF ": field '%s%s' must be a string, got %s", p->path, p->where, k, type_name(v));
  if (strlen(v->valuestring) >= cap)
    return TIDE_ERR(TIDE_E_UNSUPPORTED, CFGF ": field '%s%s' = \"%.60s\" is not a value tide knows", p->path, p->where,
                    k, v->valuestring);
  set_str(dst, cap, v->valuestring);
  return TIDE_OK;
}

/* bos/eos: an integer, null, or a list (the first entry) */
static int get_token(const pctx *p, const cJSON *o, const char *k, int64_t *dst) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!v) return TIDE_OK;
  if (cJSON_IsNull(v)) {
    *dst = -1;
    return TIDE_OK;
  }
  if (cJSON_IsArray(v)) {
    if (cJSON_GetArraySize(v) == 0) {
      *dst = -1;
      return TIDE_OK;
    }
    v = cJSON_GetArrayItem(v, 0);
  }
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 || v->valuedouble > 2147483647.0)
    return TIDE_ERR(TIDE_E_FORMAT, CFGF ": field '%s' must be a token id (a non-negative integer), got %s", p->path, k,
                    type_name(v));
  *dst = (int64_t)v->valuedouble;
  return TIDE_OK;
}

static int parse_obj(tide_config *c, const cJSON *root, const char *path) {
  pctx p = {path, ""};
  if (!cJSON_GetObjectItemCaseSensitive(root, "model_type") && !cJSON_GetObjectItemCaseSensitive(root, "architectures"))
    return TIDE_ERR(TIDE_E_UNSUPPORTED,
                    CFGF ": neither model_type nor architectures is given: expected a Hugging Face DeepSeek-V4 config "
                         "(model_type \"deepseek_v4\")",
                    path);
  TIDE_CHECK(get_str(&p, root, "model_type", c->model_type, sizeof c->model_type));
  const cJSON *arch = field(root, "architectures");
  if (arch) {
    if (!cJSON_IsArray(arch) || cJSON_GetArraySize(arch) < 1)
      return TIDE_ERR(TIDE_E_FORMAT, CFGF ": field 'architectures' must be a non-empty list of strings", path);
    const cJSON *a, *pick = NULL;
    cJSON_ArrayForEach(a, arch) {
      if (!cJSON_IsString(a))
        return TIDE_ERR(TIDE_E_FORMAT, CFGF ": field 'architectures' must be a list of strings", path);
      if (!pick || !strcmp(a->valuestring, "DeepseekV4ForCausalLM")) pick = a;
    }
    if (strlen(pick->valuestring) >= sizeof c->architecture)
      return TIDE_ERR(TIDE_E_UNSUPPORTED, CFGF ": architecture \"%.60s...\" is not one tide knows", path,
                      pick->valuestring);
    set_str(c->architecture, sizeof c->architecture, pick->valuestring);
  }
  TIDE_CHECK(get_str(&p, root, "torch_dtype", c->torch_dtype, sizeof c->torch_dtype));
  TIDE_CHECK(get_str(&p, root, "hidden_act", c->hidden_act, sizeof c->hidden_act));
  TIDE_CHECK(get_str(&p, root, "scoring_func", c->scoring_func, sizeof c->scoring_func));
  TIDE_CHECK(get_str(&p, root, "topk_method", c->topk_method, sizeof c->topk_method));
  TIDE_CHECK(get_i64(&p, root, "vocab_size", 0, (int64_t)1 << 40, &c->vocab_size));
  TIDE_CHECK(get_i64(&p, root, "hidden_size", 0, (int64_t)1 << 40, &c->hidden_size));
  TIDE_CHECK(get_i64(&p, root, "max_position_embeddings", 0, (int64_t)1 << 50, &c->max_position_embeddings));
  TIDE_CHECK(get_token(&p, root, "bos_token_id", &c->bos_token_id));
  TIDE_CHECK(get_token(&p, root, "eos_token_id", &c->eos_token_id));
  struct { const char *k; int32_t *v; } ints[] = {
      {"num_hidden_layers", &c->num_hidden_layers}, {"num_attention_heads", &c->num_attention_heads},
      {"num_key_value_heads", &c->num_key_value_heads}, {"head_dim", &c->head_dim},
      {"qk_rope_head_dim", &c->qk_rope_head_dim}, {"q_lora_rank", &c->q_lora_rank},
      {"o_lora_rank", &c->o_lora_rank}, {"o_groups", &c->o_groups}, {"sliding_window", &c->sliding_window},
      {"index_n_heads", &c->index_n_heads}, {"index_head_dim", &c->index_head_dim}, {"index_topk", &c->index_topk},
      {"n_routed_experts", &c->n_routed_experts}, {"num_experts_per_tok", &c->num_experts_per_tok},
      {"n_shared_experts", &c->n_shared_experts}, {"moe_intermediate_size", &c->moe_intermediate_size},
      {"num_hash_layers", &c->num_hash_layers}, {"hc_mult", &c->hc_mult},
      {"hc_sinkhorn_iters", &c->hc_sinkhorn_iters}, {"num_nextn_predict_layers", &c->num_nextn_predict_layers},
  };
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) TIDE_CHECK(get_i32(&p, root, ints[i].k, ints[i].v));
  TIDE_CHECK(get_bool(&p, root, "norm_topk_prob", &c->norm_topk_prob));
  TIDE_CHECK(get_bool(&p, root, "tie_word_embeddings", &c->tie_word_embeddings));
  TIDE_CHECK(get_bool(&p, root, "attention_bias", &c->attention_bias));
  struct { const char *k; double *v; } dbl[] = {
      {"rope_theta", &c->rope_theta}, {"compress_rope_theta", &c->compress_rope_theta},
      {"routed_scaling_factor", &c->routed_scaling_factor}, {"swiglu_limit", &c->swiglu_limit},
      {"hc_eps", &c->hc_eps}, {"rms_norm_eps", &c->rms_norm_eps},
  };
  for (size_t i = 0; i < sizeof dbl / sizeof dbl[0]; i++) TIDE_CHECK(get_f64(&p, root, dbl[i].k, dbl[i].v));

  const cJSON *cr = field(root, "compress_ratios");
  if (cr) {
    if (!cJSON_IsArray(cr)) return TIDE_ERR(TIDE_E_FORMAT, CFGF ": field 'compress_ratios' must be a list", path);
    int n = cJSON_GetArraySize(cr);
    if (n > 256)
      return TIDE_ERR(TIDE_E_UNSUPPORTED, CFGF ": compress_ratios has %d entries, tide supports at most 256", path, n);
    const cJSON *e;
    int i = 0;
    cJSON_ArrayForEach(e, cr) {
      if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || fabs(e->valuedouble) > 1e9)
        return TIDE_ERR(TIDE_E_FORMAT, CFGF ": compress_ratios[%d] must be an integer, got %s", path, i, type_name(e));
      c->compress_ratios[i++] = (int32_t)e->valuedouble;
    }
    for (int j = i; j < 256; j++) c->compress_ratios[j] = 0;
    c->n_compress_ratios = n;
  }

  /* rope_scaling: absent = the reference's YaRN defaults; null = none */
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
  if (rs && cJSON_IsNull(rs)) {
    c->rope_scaling = 0;
    c->rope_scaling_type[0] = 0;
  } else if (rs) {
    if (!cJSON_IsObject(rs))
      return TIDE_ERR(TIDE_E_FORMAT, CFGF ": field 'rope_scaling' must be an object or null, got %s", path,
                      type_name(rs));
    pctx q = {path, "rope_scaling."};
    c->rope_scaling = 1;
    const char *tk = field(rs, "type") ? "type" : "rope_type";
    if (!field(rs, tk))
      return TIDE_ERR(TIDE_E_FORMAT, CFGF ": rope_scaling has no \"type\" (or \"rope_type\")", path);
    TIDE_CHECK(get_str(&q, rs, tk, c->rope_scaling_type, sizeof c->rope_scaling_type));
    TIDE_CHECK(get_f64(&q, rs, "factor", &c->rope_factor));
    TIDE_CHECK(get_f64(&q, rs, "original_max_position_embeddings", &c->rope_original_max_position_embeddings));
    TIDE_CHECK(get_f64(&q, rs, "beta_fast", &c->rope_beta_fast));
    TIDE_CHECK(get_f64(&q, rs, "beta_slow", &c->rope_beta_slow));
    TIDE_CHECK(get_f64(&q, rs, "mscale", &c->rope_mscale));
    TIDE_CHECK(get_f64(&q, rs, "mscale_all_dim", &c->rope_mscale_all_dim));
  }

  /* quantization_config: absent or null = unquantised */
  const cJSON *qc = field(root, "quantization_config");
  if (qc) {
    if (!cJSON_IsObject(qc))
      return TIDE_ERR(TIDE_E_FORMAT, CFGF ": field 'quantization_config' must be an object, got %s", path,
                      type_name(qc));
    pctx q = {path, "quantization_config."};
    if (!field(qc, "quant_method"))
      return TIDE_ERR(TIDE_E_FORMAT, CFGF ": quantization_config has no quant_method", path);
    TIDE_CHECK(get_str(&q, qc, "quant_method", c->quant_method, sizeof c->quant_method));
    TIDE_CHECK(get_str(&q, qc, "fmt", c->quant_fmt, sizeof c->quant_fmt));
    TIDE_CHECK(get_str(&q, qc, "scale_fmt", c->quant_scale_fmt, sizeof c->quant_scale_fmt));
    TIDE_CHECK(get_str(&q, qc, "activation_scheme", c->activation_scheme, sizeof c->activation_scheme));
    TIDE_CHECK(get_str(&q, qc, "expert_dtype", c->expert_dtype, sizeof c->expert_dtype));
    const cJSON *wb = field(qc, "weight_block_size");
    if (wb) {
      if (!cJSON_IsArray(wb) || cJSON_GetArraySize(wb) != 2 || !cJSON_IsNumber(cJSON_GetArrayItem(wb, 0)) ||
          !cJSON_IsNumber(cJSON_GetArrayItem(wb, 1)))
        return TIDE_ERR(TIDE_E_FORMAT, CFGF ": quantization_config.weight_block_size must be [rows, cols]", path);
      for (int i = 0; i < 2; i++) {
        double v = cJSON_GetArrayItem(wb, i)->valuedouble;
        c->weight_block_size[i] = (v >= 0 && v <= 1 << 20 && v == floor(v)) ? (int32_t)v : -1;
      }
    }
  }
  TIDE_CHECK(get_str(&p, root, "expert_dtype", c->expert_dtype, sizeof c->expert_dtype));

  /* derived */
  if (!strcmp(c->scoring_func, "sqrtsoftplus")) c->scoring = TIDE_SCORING_SQRTSOFTPLUS;
  else if (!strcmp(c->scoring_func, "sigmoid")) c->scoring = TIDE_SCORING_SIGMOID;
  else if (!strcmp(c->scoring_func, "softmax")) c->scoring = TIDE_SCORING_SOFTMAX;
  else c->scoring = -1;
  c->linear_format = !strcmp(c->quant_method, "fp8") ? TIDE_FMT_FP8 : TIDE_FMT_BF16;
  if (!strcmp(c->expert_dtype, "fp4")) c->expert_format = TIDE_FMT_FP4;
  else if (!strcmp(c->expert_dtype, "fp8")) c->expert_format = TIDE_FMT_FP8;
  else if (!strcmp(c->expert_dtype, "bf16") || !strcmp(c->expert_dtype, "bfloat16")) c->expert_format = TIDE_FMT_BF16;
  else c->expert_format = c->linear_format;
  return TIDE_OK;
}

int tide_config_parse(tide_config *out, const char *json, int64_t len, const char *path) {
  if (!out || !json || len < 0) return TIDE_ERR(TIDE_E_INVALID, "NULL argument");
  if (!path) path = "config.json";
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)len, &end, 0);
  if (!root)
    return TIDE_ERR(TIDE_E_FORMAT, CFGF ": not valid JSON (error near byte %lld)", path,
                    (long long)(end ? end - json : 0));
  int rc = TIDE_OK;
  for (const char *q = end; q < json + len; q++)
    if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
      rc = TIDE_ERR(TIDE_E_FORMAT, CFGF ": text after the JSON object (byte %lld)", path, (long long)(q - json));
      break;
    }
  if (rc == TIDE_OK && !cJSON_IsObject(root)) rc = TIDE_ERR(TIDE_E_FORMAT, CFGF ": not a JSON object", path);
  tide_config c;
  tide_config_defaults(&c);
  if (rc == TIDE_OK) rc = parse_obj(&c, root, path);
  cJSON_Delete(root);
  if (rc == TIDE_OK) rc = tide_config_validate(&c, path);
  if (rc == TIDE_OK) *out = c;
  return rc;
}

/* ---- what tide supports ---- */
#define UNSUP(...) TIDE_ERR(TIDE_E_UNSUPPORTED, __VA_ARGS__)

int tide_config_validate(const tide_config *c, const char *path) {
  if (!c) return TIDE_ERR(TIDE_E_INVALID, "NULL config");
  if (!path) path = "config.json";
  if (strcmp(c->model_type, "deepseek_v4"))
    return UNSUP(CFGF ": model_type \"%s\": tide supports the deepseek_v4 family", path, c->model_type);
  if (strcmp(c->architecture, "DeepseekV4ForCausalLM"))
    return UNSUP(CFGF ": architectures does not list DeepseekV4ForCausalLM (got \"%s\")", path, c->architecture);
  if (c->vocab_size < 1) return UNSUP(CFGF ": vocab_size %lld must be >= 1", path, (long long)c->vocab_size);
  if (c->hidden_size < 1) return UNSUP(CFGF ": hidden_size %lld must be >= 1", path, (long long)c->hidden_size);
  if (c->max_position_embeddings < 1)
    return UNSUP(CFGF ": max_position_embeddings %lld must be >= 1", path, (long long)c->max_position_embeddings);
  if (c->num_hidden_layers < 1 || c->num_hidden_layers > 255)
    return UNSUP(CFGF ": num_hidden_layers %d: tide supports 1..255", path, c->num_hidden_layers);
  if (c->num_nextn_predict_layers < 0 || c->num_hidden_layers + c->num_nextn_predict_layers > 256)
    return UNSUP(CFGF ": num_nextn_predict_layers %d: expected 0..%d", path, c->num_nextn_predict_layers,
                 256 - c->num_hidden_layers);
  if (c->num_attention_heads < 1) return UNSUP(CFGF ": num_attention_heads %d must be >= 1", path, c->num_attention_heads);
  if (c->num_key_value_heads != 1)
    return UNSUP(CFGF ": num_key_value_heads %d: DeepSeek-V4 has one latent KV head (expected 1)", path,
                 c->num_key_value_heads);
  if (c->head_dim != 512) return UNSUP(CFGF ": head_dim %d: tide supports 512", path, c->head_dim);
  if (c->qk_rope_head_dim != 64) return UNSUP(CFGF ": qk_rope_head_dim %d: tide supports 64", path, c->qk_rope_head_dim);
  if (c->q_lora_rank < 1) return UNSUP(CFGF ": q_lora_rank %d must be >= 1", path, c->q_lora_rank);
  if (c->o_lora_rank < 1) return UNSUP(CFGF ": o_lora_rank %d must be >= 1", path, c->o_lora_rank);
  if (c->o_groups < 1 || c->num_attention_heads % c->o_groups)
    return UNSUP(CFGF ": o_groups %d must divide num_attention_heads %d", path, c->o_groups, c->num_attention_heads);
  if (c->sliding_window < 1) return UNSUP(CFGF ": sliding_window %d must be >= 1", path, c->sliding_window);
  if (c->index_n_heads < 1) return UNSUP(CFGF ": index_n_heads %d must be >= 1", path, c->index_n_heads);
  if (c->index_head_dim != 128) return UNSUP(CFGF ": index_head_dim %d: tide supports 128", path, c->index_head_dim);
  if (c->index_topk < 1) return UNSUP(CFGF ": index_topk %d must be >= 1", path, c->index_topk);
  if (c->n_routed_experts < 1) return UNSUP(CFGF ": n_routed_experts %d must be >= 1", path, c->n_routed_experts);
  if (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->n_routed_experts)
    return UNSUP(CFGF ": num_experts_per_tok %d must be in 1..n_routed_experts (%d)", path, c->num_experts_per_tok,
                 c->n_routed_experts);
  if (c->n_shared_experts < 0) return UNSUP(CFGF ": n_shared_experts %d must be >= 0", path, c->n_shared_experts);
  if (c->moe_intermediate_size < 1)
    return UNSUP(CFGF ": moe_intermediate_size %d must be >= 1", path, c->moe_intermediate_size);
  if (c->scoring < 0)
    return UNSUP(CFGF ": scoring_func \"%s\": tide supports sqrtsoftplus, sigmoid and softmax", path, c->scoring_func);
  if (strcmp(c->topk_method, "noaux_tc"))
    return UNSUP(CFGF ": topk_method \"%s\": tide supports noaux_tc", path, c->topk_method);
  if (strcmp(c->hidden_act, "silu")) return UNSUP(CFGF ": hidden_act \"%s\": tide supports silu", path, c->hidden_act);
  if (c->num_hash_layers < 0 || c->num_hash_layers > c->num_hidden_layers)
    return UNSUP(CFGF ": num_hash_layers %d must be in 0..num_hidden_layers (%d)", path, c->num_hash_layers,
                 c->num_hidden_layers);
  if (c->hc_mult < 1 || c->hc_mult > 16) return UNSUP(CFGF ": hc_mult %d: tide supports 1..16", path, c->hc_mult);
  if (c->hc_sinkhorn_iters < 1 || c->hc_sinkhorn_iters > 1000)
    return UNSUP(CFGF ": hc_sinkhorn_iters %d: expected 1..1000", path, c->hc_sinkhorn_iters);
  if (!(c->hc_eps >= 0) || !isfinite(c->hc_eps)) return UNSUP(CFGF ": hc_eps %g must be >= 0", path, c->hc_eps);
  if (!(c->rms_norm_eps > 0) || !isfinite(c->rms_norm_eps))
    return UNSUP(CFGF ": rms_norm_eps %g must be > 0", path, c->rms_norm_eps);
  if (!(c->routed_scaling_factor > 0) || !isfinite(c->routed_scaling_factor))
    return UNSUP(CFGF ": routed_scaling_factor %g must be > 0", path, c->routed_scaling_factor);
  if (!(c->swiglu_limit >= 0) || !isfinite(c->swiglu_limit))
    return UNSUP(CFGF ": swiglu_limit %g must be >= 0 (0 = no clamp)", path, c->swiglu_limit);
  if (c->attention_bias) return UNSUP(CFGF ": attention_bias true: DeepSeek-V4 has no attention biases", path);
  if (c->n_compress_ratios < c->num_hidden_layers)
    return UNSUP(CFGF ": compress_ratios has %d entries but num_hidden_layers is %d (one per layer needed)", path,
                 c->n_compress_ratios, c->num_hidden_layers);
  for (int i = 0; i < c->n_compress_ratios; i++) {
    int r = c->compress_ratios[i];
    if (r != 0 && r != 1 && r != 4 && r != 128)
      return UNSUP(CFGF ": compress_ratios[%d] = %d: tide supports 0, 1, 4 and 128", path, i, r);
  }
  if (!(c->rope_theta > 0) || !(c->compress_rope_theta > 0))
    return UNSUP(CFGF ": rope_theta %g and compress_rope_theta %g must be > 0", path, c->rope_theta,
                 c->compress_rope_theta);
  if (c->rope_scaling) {
    if (strcmp(c->rope_scaling_type, "yarn"))
      return UNSUP(CFGF ": rope_scaling type \"%s\": tide supports yarn (or rope_scaling null)", path,
                   c->rope_scaling_type);
    if (!(c->rope_factor >= 1)) return UNSUP(CFGF ": rope_scaling.factor %g must be >= 1", path, c->rope_factor);
    if (!(c->rope_original_max_position_embeddings >= 1))
      return UNSUP(CFGF ": rope_scaling.original_max_position_embeddings %g must be >= 1", path,
                   c->rope_original_max_position_embeddings);
    if (!(c->rope_beta_fast > 0) || !(c->rope_beta_slow > 0))
      return UNSUP(CFGF ": rope_scaling beta_fast %g and beta_slow %g must be > 0", path, c->rope_beta_fast,
                   c->rope_beta_slow);
  }
  if (c->quant_method[0]) {
    if (strcmp(c->quant_method, "fp8"))
      return UNSUP(CFGF ": quantization_config.quant_method \"%s\": tide supports fp8", path, c->quant_method);
    if (c->quant_fmt[0] && strcmp(c->quant_fmt, "e4m3"))
      return UNSUP(CFGF ": quantization_config.fmt \"%s\": tide supports e4m3", path, c->quant_fmt);
    if (c->quant_scale_fmt[0] && strcmp(c->quant_scale_fmt, "ue8m0"))
      return UNSUP(CFGF ": quantization_config.scale_fmt \"%s\": tide supports ue8m0", path, c->quant_scale_fmt);
    if (c->weight_block_size[0] != 128 || c->weight_block_size[1] != 128)
      return UNSUP(CFGF ": quantization_config.weight_block_size [%d, %d]: tide supports [128, 128]", path,
                   c->weight_block_size[0], c->weight_block_size[1]);
  }
  if (c->expert_dtype[0] && strcmp(c->expert_dtype, "fp4") && strcmp(c->expert_dtype, "fp8") &&
      strcmp(c->expert_dtype, "bf16") && strcmp(c->expert_dtype, "bfloat16"))
    return UNSUP(CFGF ": expert_dtype \"%s\": tide supports fp4, fp8 and bf16", path, c->expert_dtype);
  if (c->expert_format == TIDE_FMT_FP4 && (c->hidden_size % 32 || c->moe_intermediate_size % 32))
    return UNSUP(CFGF ": MXFP4 experts need hidden_size (%lld) and moe_intermediate_size (%d) divisible by 32", path,
                 (long long)c->hidden_size, c->moe_intermediate_size);
  return TIDE_OK;
}

int tide_config_layer_ratio(const tide_config *c, int layer) {
  if (!c) return TIDE_ERR(TIDE_E_INVALID, "NULL config");
  if (layer < 0 || layer >= c->num_hidden_layers + c->num_nextn_predict_layers)
    return TIDE_ERR(TIDE_E_RANGE, "layer %d outside 0..%d (%d layers + %d MTP)", layer,
                    c->num_hidden_layers + c->num_nextn_predict_layers - 1, c->num_hidden_layers,
                    c->num_nextn_predict_layers);
  int r = layer < c->n_compress_ratios ? c->compress_ratios[layer] : 0;
  return r <= 1 ? 1 : r;
}

/* ---- inventory ---- */
typedef struct {
  tide_tensor_spec *v;   /* NULL: count only, or hand each spec to fn */
  int64_t n, cap;
  const tide_config *c;
  int (*fn)(void *ctx, const tide_tensor_spec *spec);
  void *ctx;
  int rc;                /* the first failure of fn */
} specv;

static void add(specv *s, int kind, int layer, int fmt, int dtype, int ndim, int64_t d0, int64_t d1, int64_t rows,
                int64_t cols, const char *fmtname, ...) __attribute__((format(printf, 11, 12)));
static void add(specv *s, int kind, int layer, int fmt, int dtype, int ndim, int64_t d0, int64_t d1, int64_t rows,
                int64_t cols, const char *fmtname, ...) {
  tide_tensor_spec one;
  tide_tensor_spec *t = &one;
  if (s->fn) {
    if (s->rc < 0) return;
  } else if (!s->v || s->n >= s->cap) { /* the counting pass (or a bug: never past the count) */
    s->n++;
    return;
  } else {
    t = &s->v[s->n];
  }
  s->n++;
  memset(t, 0, sizeof *t);
  va_list ap;
  va_start(ap, fmtname);
  vsnprintf(t->name, sizeof t->name, fmtname, ap);
  va_end(ap);
  t->kind = kind;
  t->layer = layer;
  t->format = fmt;
  t->dtype = dtype;
  t->ndim = ndim;
  t->shape[0] = d0;
  t->shape[1] = ndim > 1 ? d1 : 1;
  t->shape[2] = t->shape[3] = 1;
  t->rows = rows;
  t->cols = cols;
  if (s->fn) s->rc = s->fn(s->ctx, t);
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* a weight [out, in] in format fmt, named PREFIX + ".weight", with its scale */
static void add_w(specv *s, int layer, int fmt, int64_t out, int64_t in, const char *prefix) {
  const tide_config *c = s->c;
  int64_t b0 = c->weight_block_size[0] > 0 ? c->weight_block_size[0] : 128;
  int64_t b1 = c->weight_block_size[1] > 0 ? c->weight_block_size[1] : 128;
  if (fmt == TIDE_FMT_FP8) {
    add(s, TIDE_SPEC_WEIGHT, layer, fmt, TIDE_F8E4M3, 2, out, in, out, in, "%s.weight", prefix);
    add(s, TIDE_SPEC_SCALE, layer, fmt, TIDE_E8M0, 2, cdiv(out, b0), cdiv(in, b1), out, in, "%s.scale", prefix);
  } else if (fmt == TIDE_FMT_FP4) {
    add(s, TIDE_SPEC_WEIGHT, layer, fmt, TIDE_I8, 2, out, in / 2, out, in, "%s.weight", prefix);
    add(s, TIDE_SPEC_SCALE, layer, fmt, TIDE_E8M0, 2, out, in / 32, out, in, "%s.scale", prefix);
  } else {
    add(s, TIDE_SPEC_WEIGHT, layer, TIDE_FMT_BF16, TIDE_BF16, 2, out, in, out, in, "%s.weight", prefix);
  }
}

static void add_block(specv *s, int L, int mtp) {
  const tide_config *c = s->c;
  char pre[40], nm[96];
  if (mtp) snprintf(pre, sizeof pre, "mtp.%d.", L - c->num_hidden_layers);
  else snprintf(pre, sizeof pre, "layers.%d.", L);
  int64_t d = c->hidden_size, hc = c->hc_mult, mix = (2 + hc) * hc, H = c->num_attention_heads, D = c->head_dim;
  int64_t G = c->o_groups, ol = c->o_lora_rank, ql = c->q_lora_rank, E = c->n_routed_experts;
  int64_t inter = c->moe_intermediate_size, sh = (int64_t)c->n_shared_experts * inter;
  int64_t nI = c->index_n_heads, dI = c->index_head_dim;
  int lf = c->linear_format, ef = c->expert_format;
  int r = tide_config_layer_ratio(c, L);
  if (mtp) {
    add_w(s, L, lf, d, d, (snprintf(nm, sizeof nm, "%se_proj", pre), nm));
    add_w(s, L, lf, d, d, (snprintf(nm, sizeof nm, "%sh_proj", pre), nm));
    add(s, TIDE_SPEC_NORM, L, -1, TIDE_BF16, 1, d, 0, 0, 0, "%senorm.weight", pre);
    add(s, TIDE_SPEC_NORM, L, -1, TIDE_BF16, 1, d, 0, 0, 0, "%shnorm.weight", pre);
    add(s, TIDE_SPEC_NORM, L, -1, TIDE_BF16, 1, d, 0, 0, 0, "%snorm.weight", pre);
    add(s, TIDE_SPEC_PARAM, L, -1, TIDE_F32, 2, hc, hc * d, 0, 0, "%shc_head_fn", pre);
    add(s, TIDE_SPEC_PARAM, L, -1, TIDE_F32, 1, hc, 0, 0, 0, "%shc_head_base", pre);
    add(s, TIDE_SPEC_PARAM, L, -1, TIDE_F32, 1, 1, 0, 0, 0, "%shc_head_scale", pre);
  }
  add(s, TIDE_SPEC_NORM, L, -1, TIDE_BF16, 1, d, 0, 0, 0, "%sattn_norm.weight", pre);
  add(s, TIDE_SPEC_NORM, L, -1, TIDE_BF16, 1, d, 0, 0, 0, "%sffn_norm.weight", pre);
  static const char *const hcn[2] = {"attn", "ffn"};
  for (int i = 0; i < 2; i++) {
    add(s, TIDE_SPEC_PARAM, L, -1, TIDE_F32, 2, mix, hc * d, 0, 0, "%shc_%s_fn", pre, hcn[i]);
    add(s, TIDE_SPEC_PARAM, L, -1, TIDE_F32, 1, mix, 0, 0, 0, "%shc_%s_base", pre, hcn[i]);
    add(s, TIDE_SPEC_PARAM, L, -1, TIDE_F32, 1, 3, 0, 0, 0, "%shc_%s_scale", pre, hcn[i]);
  }
#define W(fmt, out, in, name) add_w(s, L, fmt, out, in, (snprintf(nm, sizeof nm, "%s" name, pre), nm))
  W(lf, ql, d, "attn.wq_a");
  add(s, TIDE_SPEC_NORM, L, -1, TIDE_BF16, 1, ql, 0, 0, 0, "%sattn.q_norm.weight", pre);
  W(lf, H * D, ql, "attn.wq_b");
  W(lf, D, d, "attn.wkv");
  add(s, TIDE_SPEC_NORM, L, -1, TIDE_BF16, 1, D, 0, 0, 0, "%sattn.kv_norm.weight", pre);
  W(lf, G * ol, (H / G) * D, "attn.wo_a");
  W(lf, d, G * ol, "attn.wo_b");
  add(s, TIDE_SPEC_PARAM, L, -1, TIDE_F32, 1, H, 0, 0, 0, "%sattn.attn_sink", pre);
  if (r > 1) {
    int64_t cw = (r == 4 ? 2 : 1) * D;
    W(TIDE_FMT_BF16, cw, d, "attn.compressor.wkv");
    W(TIDE_FMT_BF16, cw, d, "attn.compressor.wgate");
    add(s, TIDE_SPEC_PARAM, L, -1, TIDE_F32, 2, r, cw, 0, 0, "%sattn.compressor.ape", pre);
    add(s, TIDE_SPEC_NORM, L, -1, TIDE_BF16, 1, D, 0, 0, 0, "%sattn.compressor.norm.weight", pre);
  }
  if (r == 4) {
    W(lf, nI * dI, ql, "attn.indexer.wq_b");
    W(TIDE_FMT_BF16, nI, d, "attn.indexer.weights_proj");
    W(TIDE_FMT_BF16, 2 * dI, d, "attn.indexer.compressor.wkv");
    W(TIDE_FMT_BF16, 2 * dI, d, "attn.indexer.compressor.wgate");
    add(s, TIDE_SPEC_PARAM, L, -1, TIDE_F32, 2, 4, 2 * dI, 0, 0, "%sattn.indexer.compressor.ape", pre);
    add(s, TIDE_SPEC_NORM, L, -1, TIDE_BF16, 1, dI, 0, 0, 0, "%sattn.indexer.compressor.norm.weight", pre);
  }
  W(TIDE_FMT_BF16, E, d, "ffn.gate");
  if (!mtp && L < c->num_hash_layers)
    add(s, TIDE_SPEC_IDS, L, -1, TIDE_I64, 2, c->vocab_size, c->num_experts_per_tok, 0, 0, "%sffn.gate.tid2eid", pre);
  else
    add(s, TIDE_SPEC_PARAM, L, -1, TIDE_F32, 1, E, 0, 0, 0, "%sffn.gate.bias", pre);
  for (int64_t e = 0; e < E; e++) {
    char ex[80];
    snprintf(ex, sizeof ex, "%sffn.experts.%lld.", pre, (long long)e);
    add_w(s, L, ef, inter, d, (snprintf(nm, sizeof nm, "%sw1", ex), nm));
    add_w(s, L, ef, d, inter, (snprintf(nm, sizeof nm, "%sw2", ex), nm));
    add_w(s, L, ef, inter, d, (snprintf(nm, sizeof nm, "%sw3", ex), nm));
  }
  if (sh > 0) {
    W(lf, sh, d, "ffn.shared_experts.w1");
    W(lf, d, sh, "ffn.shared_experts.w2");
    W(lf, sh, d, "ffn.shared_experts.w3");
  }
#undef W
}

static void walk(specv *s) {
  const tide_config *c = s->c;
  int64_t d = c->hidden_size, hc = c->hc_mult;
  add(s, TIDE_SPEC_EMBED, -1, -1, TIDE_BF16, 2, c->vocab_size, d, 0, 0, "embed.weight");
  if (!c->tie_word_embeddings)
    add(s, TIDE_SPEC_WEIGHT, -1, TIDE_FMT_BF16, TIDE_BF16, 2, c->vocab_size, d, c->vocab_size, d, "head.weight");
  add(s, TIDE_SPEC_NORM, -1, -1, TIDE_BF16, 1, d, 0, 0, 0, "norm.weight");
  add(s, TIDE_SPEC_PARAM, -1, -1, TIDE_F32, 2, hc, hc * d, 0, 0, "hc_head_fn");
  add(s, TIDE_SPEC_PARAM, -1, -1, TIDE_F32, 1, hc, 0, 0, 0, "hc_head_base");
  add(s, TIDE_SPEC_PARAM, -1, -1, TIDE_F32, 1, 1, 0, 0, 0, "hc_head_scale");
  for (int L = 0; L < c->num_hidden_layers; L++) add_block(s, L, 0);
  for (int i = 0; i < c->num_nextn_predict_layers; i++) add_block(s, c->num_hidden_layers + i, 1);
}

int tide_config_inventory_walk(const tide_config *c, int (*fn)(void *ctx, const tide_tensor_spec *spec), void *ctx) {
  if (!c || !fn) return TIDE_ERR(TIDE_E_INVALID, "NULL argument");
  TIDE_CHECK(tide_config_validate(c, "config"));
  specv s = {NULL, 0, 0, c, fn, ctx, TIDE_OK};
  walk(&s);
  return s.rc;
}

int tide_config_inventory(const tide_config *c, tide_tensor_spec **out, int64_t *n) {
  if (!c || !out || !n) return TIDE_ERR(TIDE_E_INVALID, "NULL argument");
  *out = NULL;
  *n = 0;
  TIDE_CHECK(tide_config_validate(c, "config"));
  /* two passes: count, then fill an array of exactly that size */
  specv s = {NULL, 0, 0, c, NULL, NULL, TIDE_OK};
  for (int pass = 0; pass < 2; pass++) {
    if (pass) {
      s.cap = s.n;
      s.n = 0;
      s.v = tide_xmalloc((size_t)(s.cap ? s.cap : 1) * sizeof *s.v);
      if (!s.v) return TIDE_ERR(TIDE_E_NOMEM, "cannot list the %lld tensors of this config", (long long)s.cap);
    }
    walk(&s);
  }
  *out = s.v;
  *n = s.n;
  return TIDE_OK;
}
