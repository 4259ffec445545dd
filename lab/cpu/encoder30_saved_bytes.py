"""Per-sample bytes of the tensors autograd saves in one training forward of a tiny
masked-LM encoder (fp32, CPU, transformers 5.17), deduplicated by storage, parameters
excluded, plus the logits the output holds: what lives at the end of the forward besides
the weights. Batch 3 minus batch 2."""
import json, sys, torch
from transformers import AutoConfig, AutoModelForMaskedLM

def live_bytes(cfg, batch, seq, attn):
    torch.manual_seed(0)
    cfg = dict(cfg)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = AutoModelForMaskedLM.from_config(config, attn_implementation=attn)
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    store = {}
    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            store[s.data_ptr()] = s.nbytes()
        return t
    ids = torch.randint(0, cfg["vocab_size"], (batch, seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids, labels=ids)
    s = out.logits.untyped_storage()
    store[s.data_ptr()] = s.nbytes()
    out.loss.backward()
    return sum(store.values())

cfgs = json.load(open(sys.argv[1]))
res = {}
for name, (cfg, seq, attn) in cfgs.items():
    # Batches 2 and 3: at batch 1 some reshapes are views that copy from batch 2 on.
    b1 = live_bytes(cfg, 2, seq, attn)
    b2 = live_bytes(cfg, 3, seq, attn)
    res[name] = {"config": cfg, "seq": seq, "attn": attn, "per_sample": b2 - b1,
                 "versions": {"torch": torch.__version__.split("+")[0], "transformers": __import__("transformers").__version__}}
    print(name, b2 - b1, file=sys.stderr)
for k, v in res.items():
    print(json.dumps({"name": k, **v}))
