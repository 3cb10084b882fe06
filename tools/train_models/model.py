"""A Llama-architecture decoder in plain PyTorch, with Hugging Face's parameter names, so the
exported safetensors load as LlamaForCausalLM (Tandem, transformers, llama.cpp's converter).
Rotate-half RoPE, RMSNorm, grouped-query attention, SwiGLU MLP."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope(x, cos, sin):  # x [b, h, t, d]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h, self.kv, self.d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        hidden = c["hidden_size"]
        self.q_proj = nn.Linear(hidden, self.h * self.d, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv * self.d, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, hidden, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv, self.d).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k = k.repeat_interleave(self.h // self.kv, dim=1)
        v = v.repeat_interleave(self.h // self.kv, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.d)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        y = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.h * self.d))


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c["hidden_size"], c["intermediate_size"], bias=False)
        self.up_proj = nn.Linear(c["hidden_size"], c["intermediate_size"], bias=False)
        self.down_proj = nn.Linear(c["intermediate_size"], c["hidden_size"], bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = Mlp(c)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Body(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        if c["tie_word_embeddings"]:
            self.lm_head.weight = self.model.embed_tokens.weight
        d = c["head_dim"]
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        pos = torch.arange(c["max_position_embeddings"], dtype=torch.float64)
        freqs = torch.outer(pos, inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos().float(), persistent=False)
        self.register_buffer("sin", emb.sin().float(), persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
        for layer in self.model.layers:  # scaled residual projections (GPT-2)
            nn.init.normal_(layer.self_attn.o_proj.weight, std=0.02 / math.sqrt(2 * c["num_hidden_layers"]))
            nn.init.normal_(layer.mlp.down_proj.weight, std=0.02 / math.sqrt(2 * c["num_hidden_layers"]))

    def forward(self, ids):  # ids [b, t] → logits [b, t, vocab]
        t = ids.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))

    def num_parameters(self):
        return sum(p.numel() for p in self.parameters())
