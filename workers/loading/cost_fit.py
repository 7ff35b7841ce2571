"""Non-negative least squares in relative error: the fit behind every cost model a worker calibrates."""
import itertools

import numpy as np


def fit_nonnegative(features: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Coefficients >= 0 minimising the squared relative error of `features @ coefficients` against `seconds`.

    features: [N, C] (C small: every subset of free coefficients is tried, which is exact NNLS); seconds: [N] > 0.
    """
    num_samples, num_coefficients = features.shape
    if num_samples < num_coefficients:
        raise ValueError(f"need at least {num_coefficients} samples to fit {num_coefficients} coefficients, "
                         f"got {num_samples}")
    if (seconds <= 0).any():
        raise ValueError("every sample needs seconds > 0")
    scaled = features / seconds[:, None]  # rows divided by the measured time: a 1 ms shape counts as a 100 ms one
    target = np.ones(num_samples)
    best: tuple[float, np.ndarray] | None = None
    for size in range(num_coefficients, 0, -1):
        for columns in itertools.combinations(range(num_coefficients), size):
            solution, *_ = np.linalg.lstsq(scaled[:, columns], target, rcond=None)
            if (solution < 0).any():
                continue
            coefficients = np.zeros(num_coefficients)
            coefficients[list(columns)] = solution
            error = float(np.sum((scaled @ coefficients - target) ** 2))
            if best is None or error < best[0]:
                best = (error, coefficients)
    if best is None:  # every column all zero: nothing explains the time
        raise ValueError("no non-negative fit: every feature is zero")
    return best[1]
