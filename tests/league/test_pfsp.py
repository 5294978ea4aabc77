"""Prioritised fictitious self-play (league/pfsp.py): the weightings' formulas and the opponents they drop."""

import numpy as np
import pytest

from policystore.league.pfsp import pfsp_probs, remove_monotonic_suffix


def test_pfsp_hard_and_var_match_their_formulas():
    x = [0.2, 0.5, 1.0]
    np.testing.assert_allclose(pfsp_probs(x, "hard"), np.array([0.64, 0.25, 0.0]) / 0.89)
    np.testing.assert_allclose(pfsp_probs(x, "var"), np.array([0.16, 0.25, 0.0]) / 0.41)


def test_pfsp_all_zero_weights_fall_back_to_uniform_not_nan():
    np.testing.assert_allclose(pfsp_probs([1.0, 1.0], "hard"), [0.5, 0.5])
    np.testing.assert_allclose(pfsp_probs([0.0, 1.0, 1.0], "var"), [1 / 3] * 3)


@pytest.mark.parametrize("rates, match", [([], "non-empty"), ([0.5, 1.5], r"\[0, 1\]"),
                                          ([float("nan")], r"\[0, 1\]")])
def test_pfsp_rejects_bad_win_rates(rates, match):
    with pytest.raises(ValueError, match=match):
        pfsp_probs(rates)
    with pytest.raises(ValueError, match="unknown PFSP weighting"):
        pfsp_probs([0.5], "linear")


def test_remove_monotonic_suffix_keeps_up_to_the_last_rise():
    rates, names = remove_monotonic_suffix(np.array([0.9, 0.5, 0.8, 0.6, 0.4]), list("abcde"))
    assert names == ["a", "b", "c"] and rates.tolist() == [0.9, 0.5, 0.8]
    rates, names = remove_monotonic_suffix(np.array([0.9, 0.8, 0.7]), list("abc"))
    assert names == [] and rates.size == 0
