"""The terms of S from two runs' per-token leaf parts (docs/METHOD.md section Shortfall attribution):
exact Fractions, and their integer JSON form that sums to S exactly."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import TypedDict

from tracekit.analyse.exact import round_half_up, round_to_sum
from tracekit.model.parts import COORDINATION, LEAF_PARTS


class AttributionIntegers(TypedDict):
    """An attribution's figures in integer ns, summing exactly: T1, TN and the ideal per token, S,
    its terms (the leaf terms rounded by largest remainder) and the coordination split."""

    per_token_ns: dict[str, int]
    shortfall_ns: int
    terms_ns: dict[str, int]
    coordination_ns: dict[str, int]


@dataclass
class Attribution:
    """Exact per-token figures of one attribution (Fractions) and their integer JSON form."""

    baseline_ns: Fraction
    sharded_ns: Fraction
    ideal_ns: Fraction
    leaf_terms: dict[str, Fraction]  # per LEAF_PARTS: PN - f P1

    @property
    def shortfall_ns(self) -> Fraction:
        return self.sharded_ns - self.ideal_ns

    def terms(self) -> dict[str, Fraction]:
        t = {
            "compute": self.leaf_terms["compute"],
            "memory": self.leaf_terms["memory"],
            "transfer": self.leaf_terms["transfer"],
            "coordination": sum((self.leaf_terms[k] for k in COORDINATION), Fraction(0)),
            "unknown": self.leaf_terms["unknown"],
        }
        assert sum(t.values()) == self.shortfall_ns, "terms do not sum to the shortfall"
        return t

    def integers(self) -> AttributionIntegers:
        """The JSON figures: ints that sum exactly (largest remainder on the leaf terms)."""
        base = round_half_up(self.baseline_ns)
        sharded = round_half_up(self.sharded_ns)
        ideal = round_half_up(self.ideal_ns)
        s = sharded - ideal
        leaf = round_to_sum(self.leaf_terms, s)
        terms = {
            "compute": leaf["compute"],
            "memory": leaf["memory"],
            "transfer": leaf["transfer"],
            "coordination": sum(leaf[k] for k in COORDINATION),
        }
        if self.leaf_terms["unknown"] != 0 or leaf["unknown"] != 0:
            terms["unknown"] = leaf["unknown"]
        assert sum(terms.values()) == s
        return AttributionIntegers(
            per_token_ns={"baseline": base, "sharded": sharded, "ideal": ideal},
            shortfall_ns=s,
            terms_ns=terms,
            coordination_ns={k: leaf[k] for k in COORDINATION},
        )


def attribute(base: Mapping[str, Fraction], sharded: Mapping[str, Fraction], factor: Fraction) -> Attribution:
    """Terms from per-token leaf parts of the baseline and the sharded run; factor = N_base / N."""
    tb = sum(base[p] for p in LEAF_PARTS)
    tn = sum(sharded[p] for p in LEAF_PARTS)
    leaf = {p: sharded[p] - factor * base[p] for p in LEAF_PARTS}
    att = Attribution(Fraction(tb), Fraction(tn), factor * tb, leaf)
    att.terms()  # asserts the exact sum
    return att


def leaf_with_window(parts: Mapping[str, Fraction]) -> dict[str, Fraction]:
    out = {p: Fraction(parts[p]) for p in LEAF_PARTS}
    out["window"] = sum((out[p] for p in LEAF_PARTS), Fraction(0))
    return out
