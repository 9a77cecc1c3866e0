"""Bad input to every attention mapping gets a clear ValueError (or TypeError), never NaN."""

import pytest
import torch

import captioner.attention as att

INF = float("inf")
FUNCS = {
    "softmax": att.softmax,
    "sparsemax": att.sparsemax,
    "entmax15": att.entmax15,
    "entmax_bisect": lambda z, dim=-1, mask=None: att.entmax_bisect(z, 1.3, dim=dim, mask=mask),
    "fusedmax": lambda z, dim=-1, mask=None: att.fusedmax(z, 0.1, dim=dim, mask=mask),
    "oscarmax": lambda z, dim=-1, mask=None: att.oscarmax(z, 0.1, dim=dim, mask=mask),
    "tv1d_prox": lambda z, dim=-1, mask=None: att.tv1d_prox(z, 0.1, dim=dim, mask=mask),
    "oscar_prox": lambda z, dim=-1, mask=None: att.oscar_prox(z, 0.1, dim=dim, mask=mask),
}


@pytest.fixture(params=sorted(FUNCS))
def func(request):
    return FUNCS[request.param]


def test_nan_rejected(func):
    with pytest.raises(ValueError, match="NaN"):
        func(torch.tensor([[0.0, float("nan"), 1.0]]))


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_bad_scores_are_named_as_the_function_called(name):
    with pytest.raises(ValueError, match=rf"^{name}: scores contain NaN"):
        FUNCS[name](torch.tensor([[0.0, float("nan"), 1.0]]))


def test_pos_inf_rejected(func):
    with pytest.raises(ValueError, match=r"\+inf"):
        func(torch.tensor([[0.0, INF]]))


def test_fully_masked_row_rejected(func):
    z = torch.zeros(3, 4)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False
    with pytest.raises(ValueError, match=r"masked or -inf in the row at index \[1\]"):
        func(z, mask=mask)
    with pytest.raises(ValueError, match="along dim 0 is masked or -inf; such a row"):
        func(torch.full((2,), -INF))


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15", "fusedmax", "tvmax"])
def test_a_fully_masked_grid_is_named_as_a_grid_of_the_callers_scores(name):
    """The grid modules flatten (..., H, W) to rows along a last dim the caller never passed:
    the message speaks of the grid and its index in the caller's leading dimensions."""
    module = att.build(name, **({"lam": 0.1} if name in ("fusedmax", "tvmax") else {}))
    scores = torch.randn(2, 3, 3, 4)
    mask = torch.ones(2, 3, 3, 4, dtype=torch.bool)
    mask[1, 2] = False
    grid = rf"^{name}: every cell of the grid at index \[1, 2\] of the leading dimensions is"
    with pytest.raises(ValueError, match=grid):
        module(scores, mask=mask)
    with pytest.raises(ValueError, match=grid):
        module(scores.masked_fill(~mask, -INF))
    with pytest.raises(ValueError, match=rf"^{name}: every cell of the grid is masked"):
        module(torch.full((3, 4), -INF))
    # The 1-D function keeps speaking of rows and dims.
    with pytest.raises(ValueError, match="along dim 0 is masked or -inf; such a row"):
        FUNCS.get(name, att.softmax)(torch.full((2,), -INF))


@pytest.mark.parametrize("name", ["fusedmax", "oscarmax", "tvmax"])
def test_lam_zero_names_the_mapping_called_not_sparsemax(name):
    """At lam = 0 these mappings are sparsemax, whose checks named sparsemax and, for TVmax,
    the flattened dim 1 the caller never passed."""
    mapping = getattr(att, name)
    scores = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match=rf"^{name}: scores contain NaN"):
        mapping(scores.index_fill(0, torch.tensor([1]), float("nan")), 0.0)
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    mask[1] = False
    masked = (r"every cell of the grid at index \[1\] of the leading dimensions" if name == "tvmax"
              else r"every entry along dim 2 is masked or -inf in the row at index \[1, 0\]")
    with pytest.raises(ValueError, match=rf"^{name}: {masked}"):
        mapping(scores, 0.0, mask=mask)


def test_the_2d_prox_names_a_fully_masked_grid_as_a_grid():
    """It spoke of 'every entry along dim 1', the flattened dim the caller never passed."""
    scores = torch.randn(2, 3, 3, 4)
    scores[1, 2] = -INF
    with pytest.raises(ValueError, match=r"^tv2d_prox: every cell of the grid at index \[1, 2\] "
                       "of the leading dimensions is masked or -inf"):
        att.tv2d_prox(scores, 0.1)


def test_bad_rank_dim_dtype_and_mask(func):
    with pytest.raises(ValueError, match="at least 1 dimension"):
        func(torch.tensor(1.0))
    with pytest.raises(ValueError, match="out of range"):
        func(torch.zeros(2, 3), dim=2)
    with pytest.raises(ValueError, match="floating-point"):
        func(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="empty"):
        func(torch.zeros(2, 0))
    with pytest.raises(ValueError, match="bool"):
        func(torch.zeros(2, 3), mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="does not broadcast"):
        func(torch.zeros(2, 3), mask=torch.ones(3, 2, dtype=torch.bool))
    with pytest.raises(TypeError, match="torch.Tensor"):
        func([0.0, 1.0])
    with pytest.raises(TypeError, match="dim must be an int"):
        func(torch.zeros(2, 3), dim=1.0)


@pytest.mark.parametrize("func", [att.fusedmax, att.oscarmax, att.tv1d_prox, att.oscar_prox])
def test_bad_lam_rejected(func):
    z = torch.zeros(2, 3)
    for bad in (-0.1, float("nan"), float("inf"), torch.tensor(-1.0)):
        with pytest.raises(ValueError, match="lam must be finite and >= 0"):
            func(z, bad)
    with pytest.raises(ValueError, match="0-dim tensor"):
        func(z, torch.tensor([0.1, 0.2]))
    with pytest.raises(TypeError, match="lam must be a float"):
        func(z, "0.1")


@pytest.mark.parametrize("n_iter", [0, True, 2.5])
def test_bisect_n_iter_validated(n_iter):
    with pytest.raises(ValueError, match="n_iter must be a positive int"):
        att.entmax_bisect(torch.zeros(3), 1.5, n_iter=n_iter)


def test_deferred_checks_raise_the_first_failure_when_read():
    checks = att.DeferredChecks()
    with checks:
        # CPU tensors have no sync to save: they are checked at once, inside or not.
        with pytest.raises(ValueError, match="scores contain NaN"):
            att.sparsemax(torch.tensor([0.0, float("nan")]))
    # What a GPU check queues: a device flag and a description read only on failure.
    described = []
    checks.add(torch.tensor(False), lambda: described.append("ok") or "never raised")
    checks.add(torch.tensor(True), lambda: "first failure")
    checks.add(torch.tensor(True), lambda: "second failure")
    with pytest.raises(ValueError, match="^first failure$"):
        checks.raise_first()
    assert described == []
    checks.raise_first()  # the queue was emptied


@pytest.mark.parametrize("order", ["flag first", "value first"])
def test_deferred_flags_and_values_fail_in_the_order_they_were_queued(order):
    """A floating verdict fails unless finite (its test is made when the checks are read)."""
    checks = att.DeferredChecks()
    checks.add(torch.tensor(2.0, dtype=torch.float64), lambda: "a finite value never fails")
    checks.add(torch.tensor(False), lambda: "a False flag never fails")
    queued = [(torch.tensor(True), "the flag"), (torch.tensor(float("inf")), "the value")]
    for verdict, message in queued if order == "flag first" else queued[::-1]:
        checks.add(verdict, lambda message=message: message)
    first = "the flag" if order == "flag first" else "the value"
    with pytest.raises(ValueError, match=f"^{first}$"):
        checks.raise_first()
    checks.add(torch.tensor(float("nan")), lambda: "nan fails")
    with pytest.raises(ValueError, match="^nan fails$"):
        checks.raise_first()


def test_a_deferred_failure_that_proves_harmless_raises_nothing():
    # checked_max's first test is coarse (the float64 sum of row maxima); when its closer look
    # finds nothing wrong, the description says so with None.
    checks = att.DeferredChecks()
    checks.add(torch.tensor(True), lambda: None)
    checks.raise_first()
    huge = torch.full((2, 3), torch.finfo(torch.float64).max, dtype=torch.float64)
    assert torch.isfinite(att.softmax(huge, dim=-1)).all()


def test_a_learned_lam_is_checked_without_a_float_conversion():
    lam = torch.tensor(-0.5, requires_grad=True)
    with pytest.raises(ValueError, match=r"lam must be finite and >= 0, got -0\.5"):
        att.tvmax(torch.zeros(2, 3, 3), lam)
