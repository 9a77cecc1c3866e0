"""REP against hand-computed values (definition: DESIGN.md "Metrics", Malaviya et al. 2018)."""

import math

import pytest

from eval.metrics.rep import rep_per_image, rep_score


def test_repeated_bigram_takes_the_minimum_over_references():
    # bigrams: (a,dog) x2, (dog,a), (dog,runs); excess of (a,dog): 2-1 vs "a dog runs",
    # 2-0 vs "the dog" -> min 1; no (w,w) bigram. L_hyp=5, L_j=[3,2] -> L_ref=2, BP=1.
    hyps, refs = ["a dog a dog runs"], [["a dog runs", "the dog"]]
    assert rep_per_image(hyps, refs) == pytest.approx([100 * 1 / 2])
    assert rep_score(hyps, refs) == pytest.approx(100 * 1 / 2)


def test_consecutive_bigram_counts_twice_plus_its_ngram_excess():
    # (the,the) x2: ngram excess 2-1=1, consecutive excess 2-1=1 -> rep = 1 + 2*1 = 3.
    hyps, refs = ["the the the cat"], [["the the cat"]]
    assert rep_per_image(hyps, refs) == pytest.approx([100 * 3 / 3])
    assert rep_score(hyps, refs) == pytest.approx(100 * 3 / 3)


def test_single_consecutive_pair_counts_without_being_repeated():
    # (a,a) occurs once: no ngram term (count must exceed 1) but consec = 1 -> rep = 2.
    # L_hyp = 2 < L_ref = 4 -> brevity factor exp(4/2 - 1).
    hyps, refs = ["a a"], [["x y z w"]]
    assert rep_per_image(hyps, refs) == pytest.approx([math.e * 100 * 2 / 4])
    assert rep_score(hyps, refs) == pytest.approx(math.e * 100 * 2 / 4)


def test_only_the_first_m_references_count():
    # m = 2 (image B has two references): A's third reference, which would explain the
    # repetition, is ignored. A: (red,red) x2 -> ngram 2, consec 2 -> 2 + 2*2 = 6.
    hyps = ["red red red", "x y"]
    refs = [["a b", "c d", "red red red"], ["x y", "z"]]
    # Per image: A has L_j = [2, 2] -> 100 * 6 / 2; B has no repetition.
    assert rep_per_image(hyps, refs) == pytest.approx([100 * 6 / 2, 0.0])
    # Corpus: L_hyp = 5, L_0 = 4, L_1 = 3 -> L_ref = 3 (hyp longer: BP = 1).
    assert rep_score(hyps, refs) == pytest.approx(100 * 6 / 3)


def test_reference_length_is_the_signed_minimum():
    # L_hyp = 8, L_0 = 9, L_1 = 4: the original script picks min(L_j - L_hyp) = L_1 = 4,
    # not the closest (9). rep: (b,b) x1 consec -> 2; (a,b) x1 -> nothing.
    hyps = ["a b b c d e f g"]
    refs = [["one two three four five six seven eight nine", "one two three four"]]
    assert rep_per_image(hyps, refs) == pytest.approx([100 * 2 / 4])
    assert rep_score(hyps, refs) == pytest.approx(100 * 2 / 4)


def test_reference_bigrams_cancel_repetitions():
    hyps, refs = ["a man and a man"], [["a man and a man"]]
    assert rep_per_image(hyps, refs) == [0.0]
    assert rep_score(hyps, refs) == 0.0


def test_per_image_rep_is_the_corpus_formula_on_each_image_alone():
    # Same scale as the corpus value (x100, normalized, brevity factor), with the corpus's m = 2
    # references; not the raw counts rep_i (6 and 2 here), which read as a far better score.
    hyps = ["red red red", "a a"]
    refs = [["a b", "c d", "red red red"], ["x y z w", "v"]]
    alone = [rep_score([hyp], [image_refs[:2]])
             for hyp, image_refs in zip(hyps, refs, strict=True)]
    assert rep_per_image(hyps, refs) == pytest.approx(alone)
    assert alone == pytest.approx([100 * 6 / 2, 100 * 2 / 1])


def test_per_image_rep_of_an_empty_caption_is_undefined():
    # No words: the brevity factor exp(L_ref / 0 - 1) is undefined, as for the corpus.
    values = rep_per_image(["", "a a"], [["a b"], ["x y z w"]])
    assert math.isnan(values[0]) and values[1] == pytest.approx(math.e * 100 * 2 / 4)


@pytest.mark.parametrize(
    ("hyps", "refs", "message"),
    [
        (["a b"], [["a"], ["b"]], "one list of references per hypothesis"),
        (["a b"], [[]], "non-empty list"),
        (["a b"], ["a b"], "non-empty list"),
        (["", " "], [["a"], ["b"]], "every hypothesis is empty"),
        ([], [], "at least one"),
    ],
)
def test_bad_input_is_named(hyps, refs, message):
    with pytest.raises(ValueError, match=message):
        rep_score(hyps, refs)
