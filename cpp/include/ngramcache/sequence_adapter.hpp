// SequenceAdapter<D>: a llama.cpp-shaped drafter (ngram_simple.hpp, ngram_map.hpp,
// ngram_mod.hpp) as a drafter of the sequence protocol (drafter_replay.hpp):
//
//   reset(prompt)     D's history = prompt without its last token, begin()
//   propose(n_max)    D.draft(id_last = the newest token), cut to n_max
//   accept(tokens)    D.accept(n_accepted) for the last non-empty proposal, then the
//                     tokens join the sequence
//   confidence()      the key size of D when the last proposal was non-empty, else 0
//
// In llama.cpp the drafter's prompt excludes the token just sampled (id_last); in the
// sequence protocol that token is the last one of the sequence. So the sequence is D's
// history followed by that one token, which D's history holds past its end unread
// (TokenHistory::push_next): tokens() is the whole sequence in one buffer, held once, and D
// indexes only what it will never see as id_last again, so a step costs what D's draft
// costs, never the context's length.
// n_accepted is the length of the prefix of the proposal that the verified tokens repeat,
// as llama.cpp counts it (accepted draft tokens, without the sampled one), also when it is
// 0; accept is not forwarded after an empty proposal, as llama-server does not verify one.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

#include "ngram.hpp"
#include "token_buffer.hpp"

namespace ngramcache {

// For a caller that holds a prompt whose first `start` tokens it knows D's history to
// share, and passes only tokens = prompt[start:]: if the history is no longer than the
// prompt and its tokens from `start` on repeat the first ones of `tokens`, the rest of
// `tokens` is appended and the result is true; otherwise nothing changes and the result is
// false (the caller then syncs the whole prompt). Costs the overlap's comparison, not the
// prompt's.
template <class D>
bool extend_history(D& d, const token_t* tokens, size_t n, size_t start) {
    const size_t have = d.history().size();
    if (start > have || start + n < have) return false;
    const size_t overlap = have - start;
    if (overlap && std::memcmp(d.history().data() + start, tokens, overlap * sizeof(token_t)) != 0) return false;
    d.append(tokens + overlap, n - overlap);
    return true;
}

template <class D>
class SequenceAdapter {
public:
    template <class... A>
    explicit SequenceAdapter(A&&... a) : d_(std::forward<A>(a)...) {}

    D& drafter() { return d_; }
    const D& drafter() const { return d_; }

    void reset(const token_t* prompt, size_t n) {
        pending_ = false;
        conf_ = 0;
        d_.sync(prompt, n > 0 ? n - 1 : 0);
        if (n > 0) d_.push_next(prompt[n - 1]);
        d_.begin();
    }

    void accept(const token_t* tokens, size_t n) {
        if (n == 0) return;
        if (pending_) {
            const size_t k = std::min(n, draft_.size());
            size_t acc = 0;
            while (acc < k && draft_[acc] == tokens[acc]) ++acc;
            d_.accept(acc);
            pending_ = false;
        }
        d_.append(tokens, n - 1);  // after the old last token, which joins the history
        d_.push_next(tokens[n - 1]);
    }

    size_t propose(size_t n_max, token_t* out) {
        pending_ = false;
        conf_ = 0;
        if (!d_.history().has_next) return 0;
        d_.draft(d_.history().tok.back(), draft_);
        if (draft_.size() > n_max) draft_.resize(n_max);  // as the server cuts a draft
        std::copy(draft_.begin(), draft_.end(), out);
        pending_ = !draft_.empty();
        if (pending_) conf_ = static_cast<int>(d_.key_size());
        return draft_.size();
    }

    int confidence() const { return conf_; }
    // The sequence: D's history and the newest token.
    const TokenBuffer& tokens() const { return d_.history().tok; }

private:
    D d_;
    bool pending_ = false;
    int conf_ = 0;
    std::vector<token_t> draft_;
};

}  // namespace ngramcache
