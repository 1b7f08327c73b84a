"""``embedline recall``'s counting: the sample is the same for the same ids and seed whatever
their order; the sampled row is left out of both lists; a tie with the k-th true neighbour
counts as found."""

from __future__ import annotations

from cli.recall import Recall, found_of, sample_ids


def test_the_sample_depends_on_the_ids_and_seed_not_their_order() -> None:
    ids = [f"id-{n}" for n in range(100)]
    assert sample_ids(ids, 5, 3) == sample_ids(list(reversed(ids)), 5, 3)
    assert sample_ids(ids, 5, 3) != sample_ids(ids, 5, 4)
    assert sorted(sample_ids(ids[:3], 10, 0)) == ids[:3]


def test_the_query_row_is_left_out_and_a_tie_counts_as_found() -> None:
    truth = [("q", 1.0), ("a", 0.9), ("b", 0.8), ("c", 0.7), ("d", 0.6)]
    assert found_of(truth, truth, "q", 3) == (3, 3)
    missed = [("q", 1.0), ("a", 0.9), ("x", 0.5), ("c", 0.7)]
    assert found_of(missed, truth, "q", 3) == (2, 3)
    tied = [("a", 0.9), ("b", 0.8), ("e", 0.7)]  # e ties c, the 3rd true neighbour
    assert found_of(tied, truth, "q", 3) == (3, 3)
    assert found_of([], [("q", 1.0)], "q", 3) == (0, 0)


def test_the_line_a_user_reads() -> None:
    assert Recall(10, 20, 174, 200).line() == (
        "recall@10  0.870 over 20 queries: search found 174 of the 200 true nearest "
        "(search --exact)"
    )
    assert "always searched exactly" in Recall(10, 5, 50, 50, exact_only=True).line()
    assert Recall(10, 0, 0, 0).value == 1.0
