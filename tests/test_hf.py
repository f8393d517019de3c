"""ngramcache.integrations.hf: drafters inside transformers' generate.

Tiny models built from a config (random weights, seeded) check the mechanics fast: greedy
identity with every drafter, the target distribution under sampling, EOS, max_new_tokens and
stopping criteria exactly as plain ``generate``, the incremental feeding of the drafter, bad
input. test_hf_figures.py checks what it reports (drafting figures, verification costs),
test_hf_models.py the packaged GGUF models, loaded by transformers itself."""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ngramcache as nc  # noqa: E402
import ngramcache.integrations.hf as hf  # noqa: E402
from ngramcache.integrations import hf_extra  # noqa: E402
from ngramcache.drafters.catalog import DRAFTERS, make_drafter  # noqa: E402

from transformers import LlamaConfig, LlamaForCausalLM, StoppingCriteria, StoppingCriteriaList  # noqa: E402
from support import own_cost_store, plain, prompt_ids, tiny, tiny_model  # noqa: E402,F401  (fixtures too)


class Recording(nc.PromptLookupDrafter):
    """Prompt lookup that records what it was shown."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls = []

    def reset(self, prompt_tokens):
        self.calls.append(("reset", np.asarray(prompt_tokens).tolist()))
        super().reset(prompt_tokens)

    def accept(self, tokens):
        self.calls.append(("accept", np.asarray(tokens).tolist()))
        super().accept(tokens)


class Fixed:
    """Proposes the same tokens at every step (a Drafter)."""

    def __init__(self, tokens):
        self.tokens = np.asarray(tokens, dtype=np.int32)
        self.n_draft = len(tokens)
        self._stats = nc.DraftStats()
        self._last = self.tokens[:0]

    @property
    def stats(self):
        return self._stats

    def reset(self, prompt_tokens):
        self._last = self.tokens[:0]

    def propose(self, n_max=None):
        self._last = self.tokens[: self.n_draft if n_max is None else n_max]
        self._stats.drafted += len(self._last)
        return self._last

    def accept(self, tokens):
        for a, b in zip(self._last.tolist(), np.asarray(tokens).tolist()):
            if a != b:
                break
            self._stats.accepted += 1
        self._last = self.tokens[:0]


def test_transformers_release_under_test():
    # the oldest-release run of the suite puts that release first on the path: make sure
    # it is the one imported
    want = os.environ.get("NGRAMCACHE_EXPECT_TRANSFORMERS")
    if want:
        assert transformers.__version__ == want
    assert hf_extra.version_tuple(transformers.__version__) >= hf.MIN_TRANSFORMERS


# --- greedy: identical to plain generate -------------------------------------------


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_greedy_identical_every_drafter(tiny, name):
    ids = prompt_ids()
    ref = plain(tiny, ids, max_new_tokens=40)
    d = make_drafter(name, n_draft=8)
    gen = hf.DrafterCandidateGenerator(d)
    out = hf.generate(tiny, ids, gen, max_new_tokens=40, do_sample=False)
    assert torch.equal(out, ref)
    assert gen.resets == 0 and gen.steps >= 1
    assert d.stats.accepted <= d.stats.drafted


def test_greedy_drafts_are_accepted(tiny):
    # the oracle's drafts are the model's own greedy tokens: all accepted, fewer steps
    ids = prompt_ids()
    ref = plain(tiny, ids, max_new_tokens=40)
    gen = hf.DrafterCandidateGenerator(nc.OracleDrafter(ref[0, ids.shape[1]:].numpy(), n_draft=8))
    out = hf.generate(tiny, ids, gen, max_new_tokens=40, do_sample=False)
    assert torch.equal(out, ref)
    assert gen.stats.accepted == gen.stats.drafted > 0
    assert gen.steps <= math.ceil(40 / 9) + 1


def test_default_drafter_and_names(tiny):
    ids = prompt_ids()
    ref = plain(tiny, ids, max_new_tokens=24)
    assert torch.equal(hf.generate(tiny, ids, max_new_tokens=24, do_sample=False), ref)
    assert torch.equal(hf.generate(tiny, ids, "suffix", max_new_tokens=24, do_sample=False), ref)
    # a 1-D list works too
    assert torch.equal(hf.generate(tiny, ids[0].tolist(), "pld", max_new_tokens=24, do_sample=False), ref)


class Collect:
    """A streamer (transformers' BaseStreamer interface) that keeps what it is given."""

    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ended += 1


def test_streamer_gets_every_token_once(tiny):
    ids = prompt_ids()
    ref_stream, ours = Collect(), Collect()
    ref = plain(tiny, ids, max_new_tokens=30, streamer=ref_stream)
    out = hf.generate(tiny, ids, "copy", max_new_tokens=30, do_sample=False, streamer=ours)
    assert torch.equal(out, ref)
    # the prompt first, then the new tokens in order, each once, then end()
    assert ours.puts[0] == ids[0].tolist() and ours.ended == 1
    assert sum(ours.puts[1:], []) == sum(ref_stream.puts[1:], []) == ref[0, ids.shape[1]:].tolist()


def test_return_dict_and_scores(tiny):
    ids = prompt_ids()
    ref = tiny.generate(ids, max_new_tokens=12, do_sample=False, return_dict_in_generate=True, output_scores=True)
    out = hf.generate(tiny, ids, make_drafter("copy", n_draft=6), max_new_tokens=12, do_sample=False,
                      return_dict_in_generate=True, output_scores=True)
    assert torch.equal(out.sequences, ref.sequences)
    assert len(out.scores) == len(ref.scores) == 12
    for a, b in zip(out.scores, ref.scores):
        assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_logits_processor_kept(tiny):
    # a repetition penalty changes the greedy path; drafts must not change it again
    ids = prompt_ids()
    ref = plain(tiny, ids, max_new_tokens=30, repetition_penalty=1.5)
    assert not torch.equal(ref, plain(tiny, ids, max_new_tokens=30))
    out = hf.generate(tiny, ids, make_drafter("copy", n_draft=8), max_new_tokens=30, do_sample=False,
                      repetition_penalty=1.5)
    assert torch.equal(out, ref)


# --- EOS, max_new_tokens, stopping criteria -----------------------------------------


def test_max_new_tokens_exact(tiny):
    ids = prompt_ids()
    full = plain(tiny, ids, max_new_tokens=30)
    cont = full[0, ids.shape[1]:].numpy()
    for m in (1, 2, 3, 5, 9, 17):
        ref = plain(tiny, ids, max_new_tokens=m)
        for d in (nc.OracleDrafter(cont, n_draft=16), Fixed(cont[:16]), make_drafter("copy", n_draft=16)):
            out = hf.generate(tiny, ids, d, max_new_tokens=m, do_sample=False)
            assert out.shape[1] == ids.shape[1] + m
            assert torch.equal(out, ref)


def test_eos_exact(tiny):
    ids = prompt_ids()
    full = plain(tiny, ids, max_new_tokens=30)
    cont = full[0, ids.shape[1]:].tolist()
    # an EOS the greedy path reaches a few tokens in (its first occurrence)
    j = next(i for i in range(3, len(cont)) if cont[i] not in cont[:i])
    eos = cont[j]
    ref = plain(tiny, ids, max_new_tokens=30, eos_token_id=eos)
    assert ref.shape[1] == ids.shape[1] + j + 1 and ref[0, -1].item() == eos
    # the oracle drafts well past the EOS: the draft must end there
    gen = hf.DrafterCandidateGenerator(nc.OracleDrafter(np.asarray(cont), n_draft=16))
    out = hf.generate(tiny, ids, gen, max_new_tokens=30, do_sample=False, eos_token_id=eos)
    assert torch.equal(out, ref)
    # several EOS ids, as in generation configs that list them
    ref2 = plain(tiny, ids, max_new_tokens=30, eos_token_id=[1, eos])
    out2 = hf.generate(tiny, ids, Fixed(cont[:16]), max_new_tokens=30, do_sample=False, eos_token_id=[1, eos])
    assert torch.equal(out2, ref2)


def test_draft_cut_at_eos_and_max_length():
    gen = hf.DrafterCandidateGenerator(Fixed([5, 6, 7, 8, 9]), eos_token_id=7, max_length=100)
    ids = torch.tensor([[3, 4]])
    cand, logits = gen.get_candidates(ids)
    assert logits is None and cand.tolist() == [[3, 4, 5, 6]]  # the EOS is the model's to produce
    gen.eos_token_id = None
    gen.max_length = 5  # 2 tokens + at most 2 drafted + the model's own
    cand, _ = gen.get_candidates(ids)
    assert cand.tolist() == [[3, 4, 5, 6]]
    gen.max_length = 3
    cand, _ = gen.get_candidates(ids)
    assert cand.tolist() == [[3, 4]]
    with pytest.raises(TypeError, match="eos_token_id"):
        gen.eos_token_id = "x"


def test_each_verification_is_timed_for_the_drafters_gate(tiny):
    class Timed(Fixed):
        def __init__(self, tokens):
            super().__init__(tokens)
            self.times = []

        def verified(self, n_tokens, seconds):
            self.times.append((n_tokens, seconds))

    class Recording(hf.DrafterCandidateGenerator):
        handed = []

        def get_candidates(self, input_ids, **kwargs):
            out, logits = super().get_candidates(input_ids, **kwargs)
            self.handed.append(out.shape[1] - input_ids.shape[1] + 1)
            return out, logits

    ids = torch.tensor([[3, 4, 5, 6, 7]])
    drafter = Timed([9, 9, 9])
    gen = Recording(drafter, max_length=100)
    hf.generate(tiny, ids, gen, max_new_tokens=12, do_sample=False)
    # each batch handed out (the draft and the model's own token) is timed once transformers
    # reports its verification
    assert len(drafter.times) >= 3 and drafter.times[0][0] == 4
    assert [n for n, _ in drafter.times] == gen.handed[: len(drafter.times)]
    assert all(s > 0 for _, s in drafter.times)


class EndsWith(StoppingCriteria):
    def __init__(self, tok):
        self.tok = tok

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.tok


def test_stopping_criteria_exact(tiny):
    ids = prompt_ids()
    full = plain(tiny, ids, max_new_tokens=30)
    cont = full[0, ids.shape[1]:].tolist()
    j = next(i for i in range(4, len(cont)) if cont[i] not in cont[:i])
    crit = StoppingCriteriaList([EndsWith(cont[j])])
    ref = plain(tiny, ids, max_new_tokens=30, stopping_criteria=crit)
    assert ref.shape[1] == ids.shape[1] + j + 1
    out = hf.generate(tiny, ids, nc.OracleDrafter(np.asarray(cont), n_draft=16), max_new_tokens=30,
                      do_sample=False, stopping_criteria=crit)
    assert torch.equal(out, ref)


def test_num_drafting_tokens_bounds_every_draft(tiny):
    # transformers reads it before the first step (recurrent caches keep that many steps)
    assert hf.DrafterCandidateGenerator(nc.PromptLookupDrafter(n_draft=10)).num_drafting_tokens == 10
    assert hf.DrafterCandidateGenerator(nc.PromptLookupDrafter(n_draft=10), n_max=3).num_drafting_tokens == 3
    ids = prompt_ids()
    ref = plain(tiny, ids, max_new_tokens=30)
    lengths = []

    class Measuring(hf.DrafterCandidateGenerator):
        def get_candidates(self, input_ids, **kwargs):
            out, logits = super().get_candidates(input_ids, **kwargs)
            lengths.append(out.shape[1] - input_ids.shape[1])
            return out, logits

    gen = Measuring(nc.OracleDrafter(ref[0, ids.shape[1]:].numpy(), n_draft=16), n_max=5)
    out = hf.generate(tiny, ids, gen, max_new_tokens=30, do_sample=False)
    assert torch.equal(out, ref)
    assert max(lengths) == gen.num_drafting_tokens == 5


# --- the drafter is fed incrementally --------------------------------------------------


def test_incremental_feeding_and_rewind(tiny):
    ids = prompt_ids()
    d = Recording(n_draft=8)
    gen = hf.DrafterCandidateGenerator(d)
    out = hf.generate(tiny, ids, gen, max_new_tokens=20, do_sample=False)
    kinds = [k for k, _ in d.calls]
    assert kinds[0] == "reset" and kinds.count("reset") == 1
    seen = [t for _, toks in d.calls for t in toks]
    assert seen == out[0].tolist()  # every verified token once, the last step's included
    assert d.tokens.tolist() == out[0].tolist()
    # a new prompt that does not extend the sequence restarts the drafter
    ids2 = ids[:, :10]
    out2 = hf.generate(tiny, ids2, gen, max_new_tokens=8, do_sample=False)
    assert gen.resets == 1 and d.calls[-1][0] in ("reset", "accept")
    assert d.tokens.tolist() == out2[0].tolist()
    assert torch.equal(out2, plain(tiny, ids2, max_new_tokens=8))


# --- sampling keeps the model's distribution ------------------------------------------


def _pit(model, seq, n_prompt: int, transform, seed: int = 7) -> np.ndarray:
    """Randomised probability integral transform of each sampled token under the model's
    exact conditional distribution (one forward pass over the final sequence): iid
    uniform on [0, 1] exactly when every token was drawn from that distribution."""
    with torch.no_grad():
        logits = model(seq).logits[0, n_prompt - 1 : -1].double()
    probs = transform(logits).softmax(-1).numpy()
    toks = seq[0, n_prompt:].numpy()
    cdf_below = np.cumsum(probs, axis=1)[np.arange(toks.size), toks] - probs[np.arange(toks.size), toks]
    v = np.random.default_rng(seed).random(toks.size)
    return cdf_below + v * probs[np.arange(toks.size), toks]


def _ks_uniform_pvalue(u: np.ndarray) -> float:
    """Kolmogorov-Smirnov test of u against U(0, 1) (asymptotic distribution)."""
    u = np.sort(u)
    n = u.size
    i = np.arange(1, n + 1)
    d = max(float(np.max(i / n - u)), float(np.max(u - (i - 1) / n)))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return min(1.0, max(0.0, p))


@pytest.mark.parametrize("temperature,top_k", [(1.0, None), (0.7, 4)])
def test_sampling_keeps_target_distribution(temperature, top_k):
    # one long sampled generation from a tiny model with peaked distributions (it falls
    # into loops the copy drafter follows, so long drafts are accepted and rejected):
    # every token must be a draw from the model's own (processed) distribution
    model = tiny_model(vocab=12, seed=3, sharpen=6.0)
    model.generation_config.eos_token_id = None
    ids = torch.tensor([[0, 2, 3, 4, 5, 2, 3, 4]])

    def transform(logits):
        x = logits / temperature
        if top_k:
            kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
            x = x.masked_fill(x < kth, -float("inf"))
        return x

    d = make_drafter("copy", n_draft=6)
    torch.manual_seed(1234)
    n = 800
    out = hf.generate(model, ids, d, max_new_tokens=n, do_sample=True, temperature=temperature,
                      top_k=top_k if top_k else 0, eos_token_id=None)
    assert out.shape[1] == ids.shape[1] + n
    assert d.stats.accepted > n // 10 and d.stats.accepted < d.stats.drafted  # both outcomes occur
    u = _pit(model, out, ids.shape[1], transform)
    assert _ks_uniform_pvalue(u) > 1e-3
    # the test has power: tokens that are not draws from the model fail it (the greedy
    # tokens; a loop of drafted tokens taken without verification)
    greedy = model.generate(ids, do_sample=False, max_new_tokens=n, eos_token_id=None)
    assert _ks_uniform_pvalue(_pit(model, greedy, ids.shape[1], transform)) < 1e-4
    fake = torch.cat([ids, torch.tensor([[2, 3, 4, 5] * (n // 4)])], dim=1)
    assert _ks_uniform_pvalue(_pit(model, fake, ids.shape[1], transform)) < 1e-4


# --- bad input ----------------------------------------------------------------------


def test_bad_input(tiny):
    ids = prompt_ids()
    with pytest.raises(ValueError, match="batch"):
        hf.generate(tiny, ids.repeat(2, 1), "pld", max_new_tokens=4)
    with pytest.raises(ValueError, match="empty"):
        hf.generate(tiny, torch.zeros((1, 0), dtype=torch.long), "pld", max_new_tokens=4)
    with pytest.raises(TypeError, match="integer"):
        hf.generate(tiny, torch.ones((1, 3)), "pld", max_new_tokens=4)
    with pytest.raises(ValueError, match="shape"):
        hf.generate(tiny, torch.ones((1, 1, 3), dtype=torch.long), "pld", max_new_tokens=4)
    with pytest.raises(TypeError, match="Drafter"):
        hf.generate(tiny, ids, object(), max_new_tokens=4)
    with pytest.raises(TypeError, match="transformers model"):
        hf.generate(object(), ids, "pld", max_new_tokens=4)
    for k in ("custom_generate", "assistant_model", "prompt_lookup_num_tokens"):
        with pytest.raises(ValueError, match=k):
            hf.generate(tiny, ids, "pld", max_new_tokens=4, **{k: 3})
    with pytest.raises(ValueError, match="beam"):
        hf.generate(tiny, ids, "pld", max_new_tokens=4, num_beams=2)
    with pytest.raises(ValueError, match="unknown drafter"):
        hf.generate(tiny, ids, "nope", max_new_tokens=4)
    with pytest.raises(ValueError, match="n_max"):
        hf.DrafterCandidateGenerator(nc.PromptLookupDrafter(), n_max=-1)
    # ids the model cannot embed are named, with the vocabulary's size
    beyond = "at index {} is beyond the vocabulary (48 tokens)"
    for bad, msg in ((torch.tensor([[1, 2, 10**6]]), "token id 1000000 " + beyond.format(2)),
                     ([5, 48], "token id 48 " + beyond.format(1)),
                     (np.array([3, 2**63], dtype=np.uint64), "token id 9223372036854775808 " + beyond.format(1)),
                     (torch.tensor([7, 2**64 - 1], dtype=torch.uint64), "token id 18446744073709551615 " + beyond.format(1)),
                     (torch.tensor([[4, -3]]), "negative token id -3 at index 1")):
        with pytest.raises(ValueError, match=re.escape("input_ids: " + msg)):
            hf.generate(tiny, bad, "pld", max_new_tokens=4)
    gen = hf.DrafterCandidateGenerator(nc.PromptLookupDrafter())
    with pytest.raises(ValueError, match="one sequence"):
        gen.get_candidates(ids.repeat(2, 1))
    assert "_get_candidate_generator" not in tiny.__dict__  # nothing left on the model


def test_missing_extra_is_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "gguf", None)  # an import of it fails
    with pytest.raises(ImportError, match=r"gguf.*ngramcache\[hf\]"):
        hf.load_model("smollm2")
    monkeypatch.setattr(hf_extra, "IMPORT_ERROR", ImportError("No module named 'transformers'"))
    with pytest.raises(ImportError, match=r"ngramcache\[hf\]"):
        hf.generate(None, [1, 2], "pld")
    monkeypatch.setattr(hf_extra, "IMPORT_ERROR", None)
    monkeypatch.setattr(hf.transformers, "__version__", "4.40.0")
    with pytest.raises(ImportError, match="transformers >= 4.57"):
        hf.generate(None, [1, 2], "pld")


def test_unknown_model_file(tmp_path):
    pytest.importorskip("gguf")
    with pytest.raises(FileNotFoundError):
        hf.load_model(tmp_path / "none.gguf")
