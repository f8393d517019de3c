// replay_drafter(): the llama-lookup-stats loop for any sequence-protocol drafter. A toy
// drafter with a known rule makes every figure computable by hand; the loop's own
// contract (what the drafter is shown, when it is reset, what carries across chunks) is
// checked by a drafter that records every call.
#include <string>
#include <vector>

#include "check.hpp"
#include "support.hpp"
#include "ngramcache/drafter_replay.hpp"

using namespace ngramcache;
using I64s = std::vector<int64_t>;
using test::replay_options;

// Proposes `k` copies of the newest token it was shown; records what it saw.
struct RepeatLast {
    size_t k = 2;
    std::vector<token_t> seq;
    std::vector<size_t> accepted_batches;
    int resets = 0;
    void reset(const token_t* p, size_t n) {
        seq.assign(p, p + n);
        ++resets;
    }
    void accept(const token_t* t, size_t n) {
        seq.insert(seq.end(), t, t + n);
        accepted_batches.push_back(n);
    }
    size_t propose(size_t n_max, token_t* out) {
        const size_t n = std::min(k, n_max);
        for (size_t i = 0; i < n; ++i) out[i] = seq.back();
        return n;
    }
};

TEST(counts_worked_out_by_hand) {
    // 5 5 5 7 7 | 9: one chunk of 5 tokens, the 9 only makes it replayable.
    //   seen [5]      propose 5 5: text 5 5 -> both accepted, then 7 sampled: +3 tokens
    //   seen 5 5 5 7  propose 7 7: text 7 -> 1 accepted, chunk full (n_new = 1)
    const std::vector<token_t> text = {5, 5, 5, 7, 7, 9};
    RepeatLast d;
    auto r = replay_drafter(d, text.data(), text.size(), replay_options(5, 2));
    CHECK_EQ(r.n_chunks, 1);
    CHECK_EQ(r.n_steps, 2);
    CHECK_EQ(r.n_drafted, 4);
    CHECK_EQ(r.n_accept, 3);
    CHECK_EQ(r.draft_length_hist, (I64s{0, 0, 2}));
    CHECK_EQ(r.accept_length_hist, (I64s{0, 1, 1}));
    CHECK_EQ(r.drafted_by_position, (I64s{2, 2}));
    CHECK_EQ(r.accepted_by_position, (I64s{2, 1}));
    CHECK_EQ(d.accepted_batches, (std::vector<size_t>{3, 1}));
    CHECK_EQ(d.seq, (std::vector<token_t>{5, 5, 5, 7, 7}));
}

TEST(each_chunk_is_a_request_and_the_drafter_sees_the_text_exactly) {
    std::vector<token_t> text;
    for (int i = 0; i < 103; ++i) text.push_back((i * 7) % 5);
    RepeatLast d;
    d.k = 3;
    auto r = replay_drafter(d, text.data(), text.size(), replay_options(25, 3));
    CHECK_EQ(r.n_chunks, 4);  // 4 x 25 = 100 < 103
    CHECK_EQ(d.resets, 4);
    // after the last chunk the drafter holds exactly that chunk
    CHECK_EQ(d.seq, std::vector<token_t>(text.begin() + 75, text.begin() + 100));
    int64_t sum = 0;
    for (size_t k = 0; k < r.draft_length_hist.size(); ++k) sum += r.draft_length_hist[k];
    CHECK_EQ(sum, r.n_steps);
    // every step gains accepted + 1 tokens except where the chunk ends
    CHECK(r.n_steps + r.n_accept >= 4 * 24);
    CHECK(r.n_steps + r.n_accept <= 4 * 24 + 4);
}

TEST(nothing_proposed_means_one_token_per_step) {
    std::vector<token_t> text(50, 1);
    RepeatLast d;
    d.k = 0;
    auto r = replay_drafter(d, text.data(), text.size(), replay_options(10, 4));
    CHECK_EQ(r.n_chunks, 4);  // (50 - 1) / 10
    CHECK_EQ(r.n_steps, 4 * 9);
    CHECK_EQ(r.n_drafted, 0);
    CHECK_EQ(r.accept_length_hist, (I64s{0, 0, 0, 0, 0}));
}

TEST(a_text_of_one_chunk_or_less_replays_nothing) {
    std::vector<token_t> text(10, 1);
    RepeatLast d;
    auto r = replay_drafter(d, text.data(), text.size(), replay_options(10, 2));
    CHECK_EQ(r.n_chunks, 0);
    CHECK_EQ(d.resets, 0);
}

TEST(bad_options_throw) {
    std::vector<token_t> text(10, 1);
    RepeatLast d;
    CHECK_THROWS_AS(replay_drafter(d, text.data(), text.size(), replay_options(1, 2)), InputError, "n_ctx");
    CHECK_THROWS_AS(replay_drafter(d, text.data(), text.size(), replay_options(4, kMaxReplayDraft + 1)), InputError, "n_draft");
}

TEST(progress_reaches_the_total) {
    std::vector<token_t> text(250001, 3);
    RepeatLast d;
    int64_t last_done = -1, last_total = -1;
    int calls = 0;
    replay_drafter(d, text.data(), text.size(), replay_options(1000, 4), [&](int64_t done, int64_t total) {
        CHECK(done >= last_done);
        last_done = done;
        last_total = total;
        ++calls;
    });
    CHECK_EQ(last_total, 250000);
    CHECK_EQ(last_done, 250000);
    CHECK(calls >= 3);
}

CHECK_MAIN()
