// The drafting gate (docs/gate.md): how many of a proposal's drafted tokens are worth
// verifying. It keeps the first k tokens, k in 0..L, that maximise
//
//     E(k) / cost(k + 1),   E(k) = 1 + p_1 + p_1 p_2 + ... + p_1 ... p_k,
//
// and drafts only when that beats a plain step (rate 1) by min_gain. p_j, the chance that
// drafted token j is right given the ones before it, is learnt per state (the proposal's
// source, its match length bucket, whether the previous proposal's first token was right)
// from decayed hits and trials, starting from a prior worth prior_weight observations. A
// draft may cost at most `risk` one-token steps beyond a plain step, a bound doubled by each
// draft kept whole and halved (not below its start) by one whose first token was wrong.
//
// This is the one implementation: ngramcache.decoding.gate.Gate drives it while decoding,
// and the gated replay (drafter_replay.hpp) applies it to a recorded stream through
// GatedSteps, the bookkeeping of a gated drafter. The arithmetic follows the order of the
// package's formulas step for step, so that a replay and a decoding loop decide alike.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ngram.hpp"  // token_t, InputError

namespace ngramcache {

// The highest prior estimate: no draft position is ever taken as certain.
constexpr double kMaxPrior = 0.995;
// What a state knows of the previous proposal: its first token was wrong (0), right (1),
// or there was none (2).
constexpr size_t kGatePrevious = 3;

// The gate's settings (the package's GateSettings holds their defaults).
struct GateParams {
    double min_gain = 0;      // how much a draft's expected rate must beat a plain step's by
    double decay = 1;         // per scored token: how fast old evidence fades
    double prior_weight = 1;  // observations a state's prior counts as
    std::optional<double> risk;  // what the first draft may cost beyond a plain step; none: no bound
    double flat_prior = 0;    // without a table of priors: every position's estimate before any evidence
};

class Gate {
public:
    // cost[k]: verifying k + 1 tokens against one token (cost[0] = 1), so drafts of up to
    // cost.size() - 1 tokens. length_buckets: the lowest confidence of each length bucket,
    // ascending. means: per state, the prior of each of cost.size() positions (the
    // package's table); empty: flat priors, shrunk towards what all states saw.
    Gate(const GateParams& params, std::vector<double> cost, std::vector<int64_t> length_buckets,
         size_t n_sources, const std::vector<std::vector<double>>& means)
        : p_(params), buckets_(std::move(length_buckets)), n_sources_(n_sources), risk_(params.risk) {
        if (!(p_.min_gain >= 0 && std::isfinite(p_.min_gain)))
            throw InputError("min_gain must be a finite number >= 0");
        if (!(p_.decay > 0 && p_.decay <= 1)) throw InputError("decay must be in (0, 1]");
        if (!(p_.prior_weight > 0 && std::isfinite(p_.prior_weight)))
            throw InputError("prior_weight must be a finite number > 0");
        if (p_.risk && !(*p_.risk > 0)) throw InputError("risk must be > 0 or none");
        if (buckets_.empty() || !std::is_sorted(buckets_.begin(), buckets_.end()))
            throw InputError("length_buckets must be ascending, at least one");
        if (n_sources_ == 0) throw InputError("n_sources must be at least 1");
        set_cost(std::move(cost));
        n_pos_ = cost_.size();
        const size_t n_states = this->n_states();
        if (!means.empty()) {
            if (means.size() != n_states)
                throw InputError("means: " + std::to_string(n_states) + " states expected, got " +
                                 std::to_string(means.size()));
            means_.reserve(n_states * n_pos_);
            for (const auto& row : means) {
                if (row.size() != n_pos_)
                    throw InputError("means: each state needs " + std::to_string(n_pos_) + " positions, got " +
                                     std::to_string(row.size()));
                means_.insert(means_.end(), row.begin(), row.end());
            }
        }
        hits_.assign(n_states * n_pos_, 0.0);
        trials_.assign(n_states * n_pos_, 0.0);
        pool_hits_.assign(n_pos_, 0.0);
        pool_trials_.assign(n_pos_, 0.0);
        pool_expected_.assign(n_pos_, 0.0);
    }

    size_t max_len() const { return n_pos_ - 1; }
    size_t n_states() const { return n_sources_ * buckets_.size() * kGatePrevious; }
    const std::vector<double>& cost() const { return cost_; }
    const std::optional<double>& risk() const { return risk_; }

    // A new curve (a learnt one): as many batch sizes as before.
    void set_cost(std::vector<double> cost) {
        if (cost.empty()) throw InputError("cost: at least the cost of one token expected");
        if (n_pos_ && cost.size() != n_pos_)
            throw InputError("cost: " + std::to_string(n_pos_) + " batch sizes expected, got " +
                             std::to_string(cost.size()));
        for (double c : cost)
            if (!(c > 0 && std::isfinite(c))) throw InputError("cost: every cost must be a positive finite number");
        cost_ = std::move(cost);
    }

    // The state of a proposal: its source, its length bucket (confidence: the match or
    // proposal length) and `previous` (kGatePrevious).
    size_t state(int64_t confidence, size_t previous, size_t source) const {
        if (source >= n_sources_) throw std::out_of_range("source " + std::to_string(source) + " out of range");
        if (previous >= kGatePrevious) throw std::out_of_range("previous must be 0, 1 or 2");
        size_t b = 0;
        for (size_t i = 0; i < buckets_.size(); ++i)
            if (confidence >= buckets_[i]) b = i;
        return (source * buckets_.size() + b) * kGatePrevious + previous;
    }

    // The estimated chance that drafted token j + 1 is right in `state`, given the ones before.
    double probability(size_t state, size_t j) const {
        const size_t i = index(state, j);
        const double w = p_.prior_weight;
        if (means_.empty())
            return (hits_[i] + w * (pool_hits_[j] + p_.flat_prior) / (pool_trials_[j] + 1.0)) / (trials_[i] + w);
        // this text's hits against the priors' expectation, only ever down: hits beyond the
        // expected come from the states that copy well and say nothing of the others
        const double scale = std::min(1.0, (pool_hits_[j] + w) / (pool_expected_[j] + w));
        return (hits_[i] + w * std::min(kMaxPrior, means_[i] * scale)) / (trials_[i] + w);
    }

    // How many of `available` drafted tokens to verify in `state` (0: do not draft).
    size_t choose(size_t state, size_t available) const {
        check_state(state);
        size_t k_max = std::min(available, max_len());
        if (risk_)
            while (k_max > 0 && cost_[k_max] - 1.0 > *risk_) --k_max;
        size_t best_k = 0;
        double best_rate = 1.0 + p_.min_gain;  // plain decoding: one token per unit of cost
        double expected = 1.0, run = 1.0;
        for (size_t j = 0; j < k_max; ++j) {
            run *= probability(state, j);
            expected += run;
            const double rate = expected / cost_[j + 1];
            if (rate > best_rate) {
                best_k = j + 1;
                best_rate = rate;
            }
        }
        return best_k;
    }

    // A draft of k tokens was verified and n_accepted kept: the bound on the next draft
    // grows (kept whole) or shrinks (first token wrong).
    void settled(size_t k, size_t n_accepted) {
        if (!risk_ || k == 0 || k > max_len()) return;
        if (n_accepted >= k)  // past the curve's longest batch the bound cannot bind: no need to grow further
            risk_ = std::min(2.0 * *risk_, cost_.back());
        else if (n_accepted == 0)
            risk_ = std::max(*p_.risk, *risk_ / 2.0);
    }

    // Drafted tokens start+1 .. start+n_scored of a proposal made in `state` were compared
    // with what followed: the first n_right were right (n_right < n_scored: the next was wrong).
    void observe(size_t state, size_t n_right, size_t n_scored, size_t start = 0) {
        check_state(state);
        const size_t end = std::min(start + n_scored, n_pos_);
        if (end <= start) return;
        n_right = std::min(n_right, end - start);
        const size_t tried = start + n_right + (start + n_right < end ? 1 : 0);
        const double d = p_.decay;
        for (size_t j = start; j < tried; ++j) {
            const size_t i = state * n_pos_ + j;
            const double hit = j < start + n_right ? 1.0 : 0.0;
            hits_[i] = hits_[i] * d + hit;
            trials_[i] = trials_[i] * d + 1.0;
            pool_hits_[j] = pool_hits_[j] * d + hit;
            pool_trials_[j] = pool_trials_[j] * d + 1.0;
            if (!means_.empty()) pool_expected_[j] = pool_expected_[j] * d + means_[i];
        }
    }

    // The decayed hits and trials of `state` per draft position (what the priors are fitted from).
    std::vector<double> hits(size_t state) const { return row(hits_, state); }
    std::vector<double> trials(size_t state) const { return row(trials_, state); }

private:
    void check_state(size_t state) const {
        if (state >= n_states())
            throw std::out_of_range("state " + std::to_string(state) + " out of range (" +
                                    std::to_string(n_states()) + " states)");
    }
    size_t index(size_t state, size_t j) const {
        check_state(state);
        if (j >= n_pos_) throw std::out_of_range("draft position out of range");
        return state * n_pos_ + j;
    }
    std::vector<double> row(const std::vector<double>& v, size_t state) const {
        check_state(state);
        return {v.begin() + static_cast<std::ptrdiff_t>(state * n_pos_),
                v.begin() + static_cast<std::ptrdiff_t>((state + 1) * n_pos_)};
    }

    GateParams p_;
    std::vector<int64_t> buckets_;
    size_t n_sources_;
    std::optional<double> risk_;
    std::vector<double> cost_;
    size_t n_pos_ = 0;                 // draft positions: cost_.size()
    std::vector<double> means_;        // [state * n_pos_ + j]; empty: flat priors
    std::vector<double> hits_, trials_;
    std::vector<double> pool_hits_, pool_trials_;
    std::vector<double> pool_expected_;  // the hits the priors expected for the same proposals
};

// A gated drafter's bookkeeping (the package's GatedDrafter), for a loop that holds the
// whole sequence: each proposal is cut by the gate, the verified draft is settled, and every
// proposal, the declined ones too, is scored against the tokens that follow it as they
// arrive, so that the gate learns at once.
class GatedSteps {
public:
    // default_source: the source of a drafter that does not name one.
    GatedSteps(Gate& gate, size_t default_source) : gate_(gate), default_source_(default_source) {}

    int64_t offered = 0;   // proposals the drafter made
    int64_t declined = 0;  // of those, the ones the gate cut to nothing

    // A new sequence whose first n_prompt tokens are given (the gate's estimates go on).
    void reset(size_t n_prompt) {
        n_ = n_prompt;
        last_.clear();
        first_.reset();
        prev_ = 2;
        pending_.clear();
    }

    // The drafter proposed cand[0..n) with `confidence` from `source` (negative: the
    // default): how many of them to verify.
    size_t propose(const token_t* cand, size_t n, int64_t confidence, int source) {
        last_.clear();
        first_.reset();
        if (n == 0) return 0;
        ++offered;
        first_ = cand[0];
        const size_t st = gate_.state(confidence, prev_, source < 0 ? default_source_ : static_cast<size_t>(source));
        pending_.push_back({n_, std::vector<token_t>(cand, cand + n), st, 0});
        const size_t k = gate_.choose(st, n);
        if (k == 0) ++declined;
        last_.assign(cand, cand + k);
        return k;
    }

    // The verifier settled on seq[n .. n + n_new), seq being the whole sequence so far.
    void accept(const token_t* seq, size_t n_new) {
        if (n_new == 0) return;
        const token_t* fresh = seq + n_;
        size_t n_acc = 0;
        while (n_acc < last_.size() && n_acc < n_new && last_[n_acc] == fresh[n_acc]) ++n_acc;
        gate_.settled(last_.size(), n_acc);
        prev_ = first_ ? (fresh[0] == *first_ ? 1 : 0) : 2;
        first_.reset();
        n_ += n_new;
        if (!pending_.empty()) score_pending(seq);
        last_.clear();
    }

private:
    struct Pending {
        size_t start;               // where the proposal stands in the sequence
        std::vector<token_t> cand;  // what it proposed
        size_t state;
        size_t done;                // tokens of it scored so far
    };

    void score_pending(const token_t* seq) {
        size_t kept = 0;
        for (Pending& p : pending_) {
            const size_t have = std::min(p.cand.size(), n_ - p.start);
            if (have > p.done) {
                const token_t* truth = seq + p.start + p.done;
                size_t right = 0;
                while (p.done + right < have && p.cand[p.done + right] == truth[right]) ++right;
                const size_t n_new = have - p.done;
                gate_.observe(p.state, right, right < n_new ? right + 1 : right, p.done);
                if (right != n_new || have >= p.cand.size()) continue;  // settled: a wrong token, or all of it
                p.done = have;
            }
            if (&pending_[kept] != &p) pending_[kept] = std::move(p);
            ++kept;
        }
        pending_.resize(kept);
    }

    Gate& gate_;
    size_t default_source_;
    size_t n_ = 0;                  // tokens in the sequence
    std::vector<token_t> last_;     // the tokens handed to the verifier this step
    std::optional<token_t> first_;  // this step's proposal's first token
    size_t prev_ = 2;               // the previous proposal's first token: 0 wrong, 1 right, 2 none
    std::vector<Pending> pending_;  // proposals being scored
};

}  // namespace ngramcache
