"""ngramcache.integrations.hf: what it reports. The drafting figures of a call (checked
against the drafts handed to transformers and the sequence it returns) and the verification
costs (measured once, kept under the model's architecture and build), on tiny random models."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ngramcache as nc  # noqa: E402
from ngramcache import hf  # noqa: E402
from support import own_cost_store, plain, prompt_ids, tiny, tiny_model  # noqa: E402,F401  (fixtures too)


class Handed(hf.DrafterCandidateGenerator):
    """Records every draft it hands to transformers, with the length of the sequence it follows."""

    def __init__(self, drafter):
        super().__init__(drafter)
        self.handed = []

    def get_candidates(self, input_ids, **kwargs):
        out, logits = super().get_candidates(input_ids, **kwargs)
        self.handed.append((input_ids.shape[1], out[0, input_ids.shape[1]:].tolist()))
        return out, logits


def _accepted_in(handed, seq: list[int]) -> int:
    total = 0
    for n, draft in handed:
        for a, b in zip(draft, seq[n:]):
            if a != b:
                break
            total += 1
    return total


@pytest.mark.parametrize("do_sample", [False, True])
def test_drafting_figures_come_with_the_output(tiny, do_sample):
    ids = prompt_ids()
    gen = Handed(nc.PromptLookupDrafter(n_draft=6))
    torch.manual_seed(3)
    out = hf.generate(tiny, ids, gen, max_new_tokens=30, do_sample=do_sample, return_dict_in_generate=True)
    f = out.drafting
    seq = out.sequences[0].tolist()
    assert isinstance(f, hf.Drafting) and f.resets == 0 and f.draft_seconds > 0
    assert f.steps == len(gen.handed) and f.drafted == sum(len(d) for _, d in gen.handed) > 0
    assert f.accepted == _accepted_in(gen.handed, seq)
    assert f.accepted > 0 or do_sample  # greedy follows the repeat in the prompt
    assert len(seq) - ids.shape[1] == f.steps + f.accepted  # each step: the accepted drafts and one token
    assert f.acceptance == f.accepted / f.drafted
    if not do_sample:
        assert seq == plain(tiny, ids, max_new_tokens=30)[0].tolist()
    # a second call with the same generator reports its own figures; the generator counts on
    gen.handed.clear()
    out2 = hf.generate(tiny, out.sequences, gen, max_new_tokens=10, do_sample=do_sample, return_dict_in_generate=True)
    f2 = out2.drafting
    assert f2.steps == len(gen.handed) and f2.accepted == _accepted_in(gen.handed, out2.sequences[0].tolist())
    assert out2.sequences.shape[1] - out.sequences.shape[1] == f2.steps + f2.accepted
    assert gen.steps == f.steps + f2.steps and gen.accepted == f.accepted + f2.accepted and gen.resets == 0
    gen.reset_counters()
    assert (gen.steps, gen.resets, gen.drafted, gen.accepted, gen.draft_seconds) == (0, 0, 0, 0, 0.0)


def test_adaptive_drafter_uses_costs(tiny):
    costs = hf.verify_costs(tiny, max_batch=5)
    assert len(costs) == 5 and all(c > 0 for c in costs)
    assert costs == sorted(costs)  # a longer batch never costs less
    assert hf.verify_costs(tiny, max_batch=5) == costs  # nothing measured: the same curve at once
    d = hf.adaptive_drafter(tiny, "copy", n_draft=4)
    assert isinstance(d.drafter, nc.CopyDrafter) and d.gate.max_len == 4
    with pytest.raises(ValueError, match="unknown drafter"):
        hf.adaptive_drafter(tiny, "nope", costs=[1.0, 1.1])


def test_cost_key_names_the_architecture_and_the_build(tiny):
    key = hf.cost_key(tiny)
    assert key.backend == "transformers" and key.model.startswith("LlamaForCausalLM config ")
    assert torch.__version__ in key.build and "float32" in key.build and key.threads == f"t{torch.get_num_threads()}"
    assert hf.cost_key(tiny_model(seed=5, sharpen=8.0)) == key  # other weights, the same costs
    assert hf.cost_key(tiny_model(vocab=64)) != key
