"""Goodness of fit: does a model of availability predict what a job saw as well as it would if it
were the truth? (``default`` falls back to Uniform Progress when no regime does.)"""

from __future__ import annotations

import numpy as np


class FitCheck:
    """Does a model predict the observed availability as well as it would if it were true?

    For each model, tick by tick, the log-likelihood of what was seen (``loglik``) next to its
    expectation and variance under that model's own prediction for the tick. If the model were the
    truth, ``loglik - expected`` would be a martingale with that variance, so
    ``z = (loglik - expected) / sqrt(variance)`` is approximately standard normal: a calibrated
    goodness-of-fit test. A zone fits none of the models when every ``z`` is far below zero.
    """

    def __init__(self, n: int):
        self.loglik = np.zeros(n)
        self.expected = np.zeros(n)
        self.variance = np.zeros(n)
        self.flips = 0

    def add(self, probs: np.ndarray, flipped: bool) -> None:
        """One tick: each model's probability that the run ends within it, and whether it did."""
        p = np.clip(probs, 1e-4, 1 - 1e-4)
        lp, lq = np.log(p), np.log1p(-p)
        self.loglik += lp if flipped else lq
        self.expected += p * lp + (1 - p) * lq
        self.variance += p * (1 - p) * (lp - lq) ** 2
        self.flips += flipped

    def z(self) -> np.ndarray:
        return (self.loglik - self.expected) / np.sqrt(np.maximum(self.variance, 1e-12))
