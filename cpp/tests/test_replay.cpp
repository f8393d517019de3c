// replay() (llama-lookup-stats' loop, docs/llama-lookup.md §5.1): a stream counted by hand from the
// drafting rules, the chunking rule, the figures' internal consistency, progress reports.
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "support.hpp"
#include "ngramcache/cache.hpp"
#include "ngramcache/lookup_file.hpp"
#include "ngramcache/replay.hpp"
#include "ngramcache/static_table.hpp"

using namespace ngramcache;
using test::Tokens;
using I64s = std::vector<int64_t>;
using test::replay_options;

// The context cache of one chunk as replay grows it: one token at a time.
static void grow_context(NgramCache& c, const token_t* chunk, size_t n) {
    for (size_t len = 2; len <= n; ++len) c.update(chunk, len, 1, 4, 1);
}

static I64s arr(const int64_t* a, int n) { return I64s(a, a + n); }

// (1 2 3) three times, twice, then a 4: n_ctx 9 makes two chunks of the same nine tokens
// and the 4 is never replayed. Worked out by hand from the drafting rules (n_draft 3, no static):
//
// chunk 1, context only (lax thresholds); each line is one draft step, then the token
// the text gives:
//   [1]          nothing (fewer than 2 tokens); 2 follows
//   [1 2]        keys (2), (1 2) absent; 3 follows
//   [1 2 3]      absent; 1 follows
//   [.. 3 1]     (1) -> 2 x1: sample 1 < 2; 2 follows
//   [.. 1 2]     (1 2) -> 3 x1 and (2) -> 3 x1: sample 1 < 2; 3 follows
//   [.. 2 3]     (1 2 3) -> 1 (3-gram), then (1 2 3 1) -> 2 and (2 3 1 2) -> 3 (4-grams):
//                3 drafted, 3 accepted, the chunk is full.
// chunk 2, the dynamic cache now holds chunk 1 (strict thresholds):
//   [1]          nothing; 2 follows
//   [1 2]        dynamic (1 2) -> 3 x3 (2-gram), (1 2 3) -> 1 x2 (3-gram), (1 2 3 1) -> 2 x2
//                (4-gram): 3 accepted, then 3 follows
//   [.. 2 3]     context as in chunk 1: 1 (3-gram), 2, 3 (4-grams), all accepted.
TEST(hand_counted_stream) {
    const Tokens s = {1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 4};
    NgramCache dyn;
    const ReplayResult r = replay(s.data(), s.size(), replay_options(9, 3), dyn, NoStatic{});
    CHECK_EQ(r.n_input, int64_t(19));
    CHECK_EQ(r.n_ctx, int64_t(9));
    CHECK_EQ(r.n_draft, int64_t(3));
    CHECK_EQ(r.n_chunks, int64_t(2));
    CHECK_EQ(r.n_steps, int64_t(6 + 3));
    CHECK_EQ(r.n_drafted, int64_t(3 + 6));
    CHECK_EQ(r.n_accept, int64_t(3 + 6));
    CHECK_EQ(arr(r.drafted_by_source, 3), (I64s{6, 3, 0}));
    CHECK_EQ(arr(r.accepted_by_source, 3), (I64s{6, 3, 0}));
    CHECK_EQ(arr(r.drafted_by_ngram, 4), (I64s{0, 1, 3, 5}));
    CHECK_EQ(arr(r.accepted_by_ngram, 4), (I64s{0, 1, 3, 5}));
    CHECK_EQ(r.draft_length_hist, (I64s{6, 0, 0, 3}));
    CHECK_EQ(r.accept_length_hist, (I64s{0, 0, 0, 3}));
    CHECK_EQ(r.drafted_by_position, (I64s{3, 3, 3}));
    CHECK_EQ(r.accepted_by_position, (I64s{3, 3, 3}));
    // Overlap over the 18 replayed tokens: positions 2..17; the 2-grams repeat from p = 5.
    CHECK_EQ(r.overlap_positions, int64_t(16));
    CHECK_EQ(r.overlap_text, int64_t(13));
    CHECK_EQ(r.overlap_static, int64_t(0));
    CHECK_EQ(r.overlap_dynamic, int64_t(0));
    CHECK_EQ(r.overlap_any, int64_t(13));
    CHECK(r.t_draft_ns >= 0);
    CHECK(r.t_replay_ns >= r.t_draft_ns);
    // Both chunks were merged into the dynamic cache, tokens in first-seen order.
    NgramCache want;
    grow_context(want, s.data(), 9);
    want.merge(want);
    test::check_same_parts(dyn, want);
}

TEST(rejected_drafts_and_the_static_source) {
    // A static cache that always predicts 7 after (1 2): drafted at the second step of the
    // chunk, rejected by the text (3 follows), then the context takes over.
    const Tokens s = {1, 2, 3, 1, 2, 3, 9};
    NgramCache st;
    st.get_or_insert(Ngram::of2(1, 2)).add(7, 5);
    NgramCache dyn;
    const ReplayResult r = replay(s.data(), s.size(), replay_options(6, 2), dyn, CacheAsStatic{&st});
    // [1] nothing; [1 2] static 7, then (2 7) unknown: 1 drafted, 0 accepted, 3 sampled;
    // [1 2 3] nothing; [.. 3 1] (1) -> 2 x1 fails, static absent: nothing; 2 sampled;
    // [.. 1 2] (1 2) -> 3 x1 fails (sample 2), static 7 again: rejected, 3 sampled.
    CHECK_EQ(r.n_chunks, int64_t(1));
    CHECK_EQ(r.n_steps, int64_t(5));
    CHECK_EQ(r.n_drafted, int64_t(2));
    CHECK_EQ(r.n_accept, int64_t(0));
    CHECK_EQ(arr(r.drafted_by_source, 3), (I64s{0, 0, 2}));
    CHECK_EQ(arr(r.accepted_by_source, 3), (I64s{0, 0, 0}));
    CHECK_EQ(arr(r.drafted_by_ngram, 4), (I64s{0, 2, 0, 0}));
    CHECK_EQ(r.draft_length_hist, (I64s{3, 2, 0}));
    CHECK_EQ(r.accept_length_hist, (I64s{2, 0, 0}));
    CHECK_EQ(r.drafted_by_position, (I64s{2, 0}));
    CHECK_EQ(r.accepted_by_position, (I64s{0, 0}));
    CHECK_EQ(r.overlap_positions, int64_t(4));
    CHECK_EQ(r.overlap_text, int64_t(1));    // (1 2) again at p = 5
    CHECK_EQ(r.overlap_static, int64_t(2));  // (1 2) at p = 2 and 5
    CHECK_EQ(r.overlap_any, int64_t(2));
}

TEST(final_chunk_is_skipped_unless_a_token_follows) {
    std::mt19937 rng(50);
    const Tokens s = test::random_stream(rng, 40, 5);
    struct Case {
        size_t n_input, n_ctx;
        int64_t chunks;
    } cases[] = {{9, 9, 0}, {10, 9, 1}, {18, 9, 1}, {19, 9, 2}, {27, 9, 2}, {28, 9, 3},
                 {2, 2, 0},  {3, 2, 1},  {40, 2, 19}, {8, 9, 0},  {0, 9, 0}};
    for (const Case& c : cases) {
        check::note() = "n_input " + std::to_string(c.n_input) + " n_ctx " + std::to_string(c.n_ctx);
        NgramCache dyn;
        const ReplayResult r = replay(s.data(), c.n_input, replay_options(c.n_ctx, 2), dyn, NoStatic{});
        CHECK_EQ(r.n_chunks, c.chunks);
        CHECK_EQ(r.overlap_positions, c.chunks * int64_t(c.n_ctx) > 2 ? c.chunks * int64_t(c.n_ctx) - 2 : 0);
        // Each replayed chunk contributed its own observations, nothing beyond them.
        NgramCache want;
        for (int64_t k = 0; k < c.chunks; ++k) {
            NgramCache one;
            grow_context(one, s.data() + k * c.n_ctx, c.n_ctx);
            want.merge(one);
        }
        test::check_same_parts(dyn, want);
        // Each chunk's tokens after the first are accepted or sampled, one step per sampled
        // token, and a chunk may end on an accepted one.
        const int64_t produced = c.chunks * (int64_t(c.n_ctx) - 1);
        CHECK(r.n_steps + r.n_accept >= produced);
        CHECK(r.n_steps + r.n_accept <= produced + c.chunks);
    }
}

TEST(bad_options_throw) {
    const Tokens s = {1, 2, 3};
    NgramCache dyn;
    CHECK_THROWS_AS(replay(s.data(), s.size(), replay_options(1, 3), dyn, NoStatic{}), InputError, "n_ctx must be >= 2, got 1");
    CHECK_THROWS_AS(replay(s.data(), s.size(), replay_options(0, 3), dyn, NoStatic{}), InputError, "n_ctx must be >= 2, got 0");
    CHECK_THROWS_AS(replay(s.data(), s.size(), replay_options(4, 65537), dyn, NoStatic{}), InputError,
                    "n_draft must be <= 65536, got 65537");
    const ReplayResult r = replay(s.data(), s.size(), replay_options(2, 0), dyn, NoStatic{});
    CHECK_EQ(r.n_drafted, int64_t(0));
    CHECK_EQ(r.n_steps, int64_t(1));
    CHECK_EQ(r.draft_length_hist, I64s{1});
    CHECK(r.drafted_by_position.empty());
}

TEST(figures_are_consistent_on_random_streams) {
    std::mt19937 rng(51);
    for (int round = 0; round < 12; ++round) {
        check::note() = "round " + std::to_string(round);
        const Tokens s = test::random_stream(rng, 300 + rng() % 900, 2 + round % 6);
        const Tokens corpus = test::random_stream(rng, 2000, 2 + round % 6);
        const size_t n_ctx = 2 + rng() % 200, n_draft = rng() % 6;
        NgramCache dyn, st;
        dyn.update(corpus.data(), corpus.size(), 1, 4, 500);
        st.update(corpus.data(), corpus.size(), 2, 2, corpus.size());
        const StaticTable table = StaticTable::build(corpus.data(), corpus.size(), 2);
        NgramCache dyn_copy;
        dyn_copy.merge(dyn);
        const ReplayResult r = replay(s.data(), s.size(), replay_options(n_ctx, n_draft), dyn, CacheAsStatic{&st});
        const ReplayResult t = replay(s.data(), s.size(), replay_options(n_ctx, n_draft), dyn_copy, table);
        // The table and the cache it matches give the same replay.
        CHECK_EQ(r.n_drafted, t.n_drafted);
        CHECK_EQ(r.n_accept, t.n_accept);
        CHECK_EQ(r.draft_length_hist, t.draft_length_hist);
        CHECK_EQ(r.accepted_by_position, t.accepted_by_position);
        CHECK_EQ(r.overlap_static, t.overlap_static);
        test::check_same_parts(dyn, dyn_copy);

        const int64_t chunks = s.size() > n_ctx ? int64_t((s.size() - 1) / n_ctx) : 0;
        CHECK_EQ(r.n_chunks, chunks);
        int64_t sum = 0, steps = 0, accepted = 0, nonempty = 0;
        for (size_t k = 0; k < r.draft_length_hist.size(); ++k) {
            steps += r.draft_length_hist[k];
            sum += int64_t(k) * r.draft_length_hist[k];
            nonempty += k > 0 ? r.draft_length_hist[k] : 0;
        }
        CHECK_EQ(steps, r.n_steps);
        CHECK_EQ(sum, r.n_drafted);
        int64_t acc_drafts = 0;
        for (size_t k = 0; k < r.accept_length_hist.size(); ++k) {
            acc_drafts += r.accept_length_hist[k];
            accepted += int64_t(k) * r.accept_length_hist[k];
        }
        CHECK_EQ(acc_drafts, nonempty);
        CHECK_EQ(accepted, r.n_accept);
        CHECK_EQ(r.drafted_by_source[0] + r.drafted_by_source[1] + r.drafted_by_source[2], r.n_drafted);
        CHECK_EQ(r.accepted_by_source[0] + r.accepted_by_source[1] + r.accepted_by_source[2], r.n_accept);
        int64_t by_ngram = 0, by_pos = 0, acc_pos = 0;
        for (int k = 0; k < 4; ++k) by_ngram += r.drafted_by_ngram[k];
        for (size_t k = 0; k < n_draft; ++k) {
            by_pos += r.drafted_by_position[k];
            acc_pos += r.accepted_by_position[k];
            CHECK(r.accepted_by_position[k] <= r.drafted_by_position[k]);
            if (k > 0) CHECK(r.drafted_by_position[k] <= r.drafted_by_position[k - 1]);
        }
        CHECK_EQ(by_ngram, r.n_drafted);
        CHECK_EQ(by_pos, r.n_drafted);
        CHECK_EQ(acc_pos, r.n_accept);
        CHECK(r.n_accept <= r.n_drafted);
        // Every replayed token but each chunk's first is accepted or sampled; one draft
        // step precedes each sampled token, and a chunk may end on an accepted one.
        const int64_t produced = chunks * int64_t(n_ctx - 1);
        CHECK(r.n_steps + r.n_accept >= produced);
        CHECK(r.n_steps + r.n_accept <= produced + chunks);
        CHECK(r.overlap_any >= r.overlap_text);
        CHECK(r.overlap_any <= r.overlap_text + r.overlap_static + r.overlap_dynamic);
    }
}

TEST(progress_is_reported_and_can_stop_the_replay) {
    std::mt19937 rng(52);
    const Tokens s = test::random_stream(rng, 250001, 3);
    std::vector<std::pair<int64_t, int64_t>> calls;
    {
        NgramCache dyn;
        const Tokens small(s.begin(), s.begin() + 3001);
        replay(small.data(), small.size(), replay_options(1000, 1), dyn, NoStatic{},
               [&](int64_t done, int64_t total) { calls.emplace_back(done, total); });
        CHECK_EQ(calls.size(), size_t(1));  // only the final report below 100000 tokens
        CHECK_EQ(calls[0].first, int64_t(3000));
        CHECK_EQ(calls[0].second, int64_t(3000));
    }
    calls.clear();
    NgramCache dyn;
    CHECK_THROWS_AS(replay(s.data(), s.size(), replay_options(1000, 1), dyn, NoStatic{},
                           [&](int64_t done, int64_t total) {
                               calls.emplace_back(done, total);
                               throw std::runtime_error("stopped by the user");
                           }),
                    std::runtime_error, "stopped by the user");
    CHECK_EQ(calls.size(), size_t(1));
    CHECK_EQ(calls[0].first, int64_t(100000));
    CHECK_EQ(calls[0].second, int64_t(250000));
    // The report came at the end of the 100th chunk, before its merge: 99 chunks were
    // merged, each with 999 observations of 1-grams.
    int64_t one_grams = 0;
    for (size_t i = 0; i < dyn.size(); ++i)
        if (dyn.key_at(i).size() == 1) one_grams += dyn.part_at(i).sum();
    CHECK_EQ(one_grams, int64_t(99 * 999));
}

CHECK_MAIN()
