// TokenBuffer: a shared block's tokens are never written again (appends past them, growth
// and shrinking while shared move to a new block), an unshared block is reused in place,
// and every drafter's tokens() is its sequence in one buffer, the adapters' included.
#include <memory>
#include <random>
#include <vector>

#include "check.hpp"
#include "ngramcache/copy_drafter.hpp"
#include "ngramcache/lookup_drafter.hpp"
#include "ngramcache/ngram_map.hpp"
#include "ngramcache/ngram_mod.hpp"
#include "ngramcache/ngram_simple.hpp"
#include "ngramcache/prompt_lookup.hpp"
#include "ngramcache/sequence_adapter.hpp"
#include "ngramcache/suffix.hpp"
#include "ngramcache/token_buffer.hpp"
#include "support.hpp"

using namespace ngramcache;
using test::Tokens;

namespace {

Tokens view(const std::shared_ptr<const token_t[]>& block, size_t n) { return Tokens(block.get(), block.get() + n); }

// Random batches through reset and accept; after each, tokens() against the tokens fed.
template <class D>
void follows_the_sequence(D& d, uint32_t seed) {
    std::mt19937 rng(seed);
    const Tokens text = test::random_stream(rng, 3000, 12);
    for (size_t prompt : {size_t{0}, size_t{1}, size_t{40}}) {
        d.reset(text.data(), prompt);
        CHECK_EQ(d.tokens().to_vector(), Tokens(text.begin(), text.begin() + prompt));
        token_t out[16];
        size_t have = prompt;
        while (have < text.size()) {
            d.propose(8, out);
            const size_t n = std::min<size_t>(1 + rng() % 9, text.size() - have);
            d.accept(text.data() + have, n);
            have += n;
            CHECK_EQ(d.tokens().size(), have);
        }
        CHECK_EQ(d.tokens().to_vector(), text);
    }
}

}  // namespace

TEST(appends_and_grows) {
    TokenBuffer b;
    CHECK(b.empty() && b.data() == nullptr && !b.share());
    Tokens want;
    for (token_t t = 0; t < 1000; ++t) {
        b.push_back(t);
        want.push_back(t);
        const token_t two[2] = {t, -t};
        b.append(two, 2);
        want.insert(want.end(), two, two + 2);
    }
    CHECK_EQ(b.to_vector(), want);
    CHECK(b == want);
    CHECK(b.capacity() >= b.size());
}

TEST(shared_tokens_never_change) {
    TokenBuffer b;
    const Tokens first = {1, 2, 3, 4, 5};
    b.assign(first.data(), first.size());
    const auto block = b.share();
    const token_t more[3] = {6, 7, 8};
    b.append(more, 3);  // past the shared size, in place while it fits
    CHECK_EQ(view(block, 5), first);
    CHECK(b.share() == block);
    for (int i = 0; i < 100; ++i) b.append(more, 3);  // growth moves to a new block
    CHECK(b.share() != block);
    CHECK_EQ(view(block, 5), first);
    CHECK_EQ(b.size(), size_t{308});

    const auto grown = b.share();
    b.truncate(2);  // shared: the kept tokens move
    CHECK(b.share() != grown);
    CHECK_EQ(view(grown, 5), first);
    b.append(more, 3);
    CHECK_EQ(view(grown, 5), first);
    CHECK_EQ(b.to_vector(), Tokens({1, 2, 6, 7, 8}));

    const auto last = b.share();
    b.clear();
    b.assign(more, 3);
    CHECK_EQ(view(last, 5), Tokens({1, 2, 6, 7, 8}));
    CHECK_EQ(b.to_vector(), Tokens({6, 7, 8}));
}

TEST(unshared_block_is_reused) {
    TokenBuffer b;
    const Tokens t = {1, 2, 3, 4, 5};
    b.assign(t.data(), t.size());
    const token_t* at = b.data();
    { const auto held = b.share(); }  // let go before the shrink
    b.truncate(1);
    b.assign(t.data(), 3);
    CHECK(b.data() == at);
    CHECK_EQ(b.to_vector(), Tokens({1, 2, 3}));
}

TEST(copy_owns_its_block) {
    TokenBuffer a;
    const Tokens t = {1, 2, 3};
    a.assign(t.data(), t.size());
    TokenBuffer b = a;
    CHECK(b.data() != a.data());
    const token_t four = 4, five = 5;
    a.push_back(four);
    b.push_back(five);
    CHECK_EQ(a.to_vector(), Tokens({1, 2, 3, 4}));
    CHECK_EQ(b.to_vector(), Tokens({1, 2, 3, 5}));
    TokenBuffer c = std::move(a);
    CHECK(a.empty() && a.data() == nullptr);
    CHECK_EQ(c.to_vector(), Tokens({1, 2, 3, 4}));
}

TEST(history_keeps_the_next_token_unread) {
    TokenHistory h;
    const Tokens p = {1, 2, 3, 4};
    h.sync(p.data(), 3);
    h.push_next(4);
    CHECK_EQ(h.size(), size_t{3});
    CHECK_EQ(h.tok.to_vector(), p);
    const token_t more[2] = {5, 6};
    h.append(more, 2);  // the next token joins the history first
    CHECK(!h.has_next);
    CHECK_EQ(h.tok.to_vector(), Tokens({1, 2, 3, 4, 5, 6}));
    h.push_next(7);
    // sync keeps a next token the new history repeats, and reports the old history kept
    const Tokens q = {1, 2, 3, 4, 5, 6, 7, 8};
    CHECK_EQ(h.sync(q.data(), q.size()), size_t{6});
    CHECK(!h.has_next);
    CHECK_EQ(h.tok.to_vector(), q);
    h.push_next(9);
    const Tokens r = {1, 2, 0};
    CHECK_EQ(h.sync(r.data(), r.size()), size_t{2});
    CHECK_EQ(h.tok.to_vector(), r);
}

TEST(every_drafter_holds_its_sequence_once) {
    {
        LookupDrafter d;
        follows_the_sequence(d, 1);
    }
    {
        CopyDrafter d;
        follows_the_sequence(d, 2);
    }
    {
        PromptLookupDrafter d;
        follows_the_sequence(d, 3);
    }
    {
        SuffixDrafter d;
        follows_the_sequence(d, 4);
    }
    {
        SequenceAdapter<NgramSimple> d;
        follows_the_sequence(d, 5);
    }
    {
        SequenceAdapter<NgramMap> d;
        follows_the_sequence(d, 6);
    }
    {
        SequenceAdapter<NgramMod> d(std::make_shared<NgramModTable>(1 << 12));
        follows_the_sequence(d, 7);
    }
}

CHECK_MAIN()
