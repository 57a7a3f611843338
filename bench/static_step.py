"""Experiment (not a product path: slower than eager where it matters): a decoder step with static shapes for torch.compile.

The self-attention cache is a preallocated (N, h, L, d_k) buffer written at position t (a tensor), the
mask is arange(L) <= t, so the step's shapes do not change with t and the compiled graph is reused.
Usage: MODEL=DIR DATA=DIR T=2 .venv/bin/python bench/static_step.py DTYPE BATCH N REPEATS
(defaults: a Multi30k model and its data under runs/; 0.93x eager measured at fp32, batch 1)
"""
import os, sys, time, statistics
import torch
import torch._dynamo
from transduce.modeldir import load_model_dir
from transduce.decode.translator import for_decoding
from transduce.decode.search import beam_search
from transduce.data import PreparedData

torch._dynamo.config.cache_size_limit = 256
torch.set_num_threads(int(os.environ.get("T", "2")))
dtype, bs, n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
MODEL = os.environ.get("MODEL", "runs/attempt5-seed1/model")
model, vocabs, _ = load_model_dir(MODEL); model.eval()
model = for_decoding(model, dtype, torch.device("cpu")).eval()


class StaticDecoder:
    def __init__(self, model, compiled: bool):
        self.model, self.config = model, model.config
        self.fn = torch.compile(self._step, dynamic=False) if compiled else self._step

    def encode(self, src):
        return self.model.encode(src)

    def init_cache(self, encoded, beam=1):
        cache = self.model.init_cache(encoded, beam)
        B, S = encoded.memory.shape[:2]
        L = -(-(S + 52) // 32) * 32  # room for |x| + 50 tokens, bucketed
        a = self.model.decoder.layers[0].self_attn
        for layer in cache.layers:
            layer.self_k = encoded.memory.new_zeros(B * beam, a.n_heads, L, a.d_k)
            layer.self_v = encoded.memory.new_zeros(B * beam, a.n_heads, L, a.d_k)
        return cache

    def _step(self, tokens, pos, ks, vs, mks, mvs, mem_mask, beam: int):
        m = self.model
        emb = m.tgt_embed
        x = emb.token(tokens)[:, None] * emb.scale + emb.positions.table.index_select(0, pos.view(1)).to(emb.token.weight.dtype)  # (N, 1, d)
        L = ks[0].size(2)
        valid = torch.arange(L, device=tokens.device) <= pos  # (L,)
        new_k, new_v = [], []
        for layer, kb, vb, mk, mv in zip(m.decoder.layers, ks, vs, mks, mvs):
            def sa(h, layer=layer, kb=kb, vb=vb):
                q, k, v = layer.self_attn.project_qkv(h)  # (N, h, 1, d_k)
                kb.index_copy_(2, pos.view(1), k)
                vb.index_copy_(2, pos.view(1), v)
                return layer.self_attn.attend(q, kb, vb, valid, step=True)

            def ca(h, layer=layer, mk=mk, mv=mv):
                attn = layer.cross_attn
                N = h.size(0)
                q = attn.q_proj(h).view(N // beam, beam, attn.n_heads, attn.d_k).transpose(1, 2)  # (B, h, beam, d_k)
                out = attn.attend(q, mk, mv, mem_mask, step=True)  # (B, beam, d)
                return out.reshape(N, 1, attn.d_model)

            x = layer.res_self(x, sa)
            x = layer.res_cross(x, ca)
            x = layer.res_ff(x, layer.ff)
        x = m.decoder.final_norm(x) if getattr(m.decoder, "final_norm", None) is not None else x
        return m.generator(x.squeeze(1))

    def decode_step(self, tokens, cache):
        pos = torch.tensor(cache.position)
        out = self.fn(tokens, pos, [l.self_k for l in cache.layers], [l.self_v for l in cache.layers],
                      [l.memory_k for l in cache.layers], [l.memory_v for l in cache.layers], cache.memory_mask, cache.beam)
        cache.position += 1
        return out


data = PreparedData.open(os.environ.get("DATA", "runs/attempt5-seed1/data")); test = data.split("test")
srcs = [ids + [3] for ids in vocabs.src.encode_batch([test.src_text(i) for i in range(n)])]
order = sorted(range(n), key=lambda i: len(srcs[i]))
bl = []
for i in range(0, n, bs):
    chunk = [srcs[j] for j in order[i:i + bs]]; W = -(-max(map(len, chunk)) // 8) * 8
    bl.append(torch.tensor([s + [0] * (W - len(s)) for s in chunk]))
engines = {"eager": model, "static-eager": StaticDecoder(model, False)}
if not os.environ.get("NOCOMPILE"):
    engines["static-compiled"] = StaticDecoder(model, True)
with torch.inference_mode():
    t0 = time.perf_counter()
    for b in bl:  # warm-up: compiles every shape once
        beam_search(engines[list(engines)[-1]], b, beam=4, alpha=0.6)
    print(f"warm-up (compiles) {time.perf_counter() - t0:.1f} s", flush=True)
    times = {k: [] for k in engines}; outs = {}
    for r in range(reps):
        for name in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
            t0 = time.perf_counter(); toks = 0; hyps = []
            for b in bl:
                h = beam_search(engines[name], b, beam=4, alpha=0.6); toks += sum(len(x[0].tokens) + 1 for x in h)
                hyps += [x[0].tokens for x in h]
            times[name].append(toks / (time.perf_counter() - t0)); outs[name] = hyps
for name in engines:
    same = sum(a == b for a, b in zip(outs[name], outs["eager"]))
    print(f"{dtype} batch {bs} {name}: {statistics.median(times[name]):.0f} tok/s "
          f"({statistics.median(times[name]) / statistics.median(times['eager']):.2f}x eager), same as eager {same}/{len(outs['eager'])}")
