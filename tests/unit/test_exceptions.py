from __future__ import annotations

import pytest

from airflow_batch_provider import exceptions as exc
from airflow_batch_provider.exceptions import (
    BatchProviderError,
    InvalidTransitionError,
    ItemError,
    LedgerError,
)

PHASES = [
    exc.ConfigurationError,
    exc.ItemError,
    exc.ChunkingError,
    exc.StagingError,
    exc.SubmitError,
    exc.PollError,
    exc.BatchFailedError,
    exc.DownloadError,
    exc.ReconcileError,
    exc.LedgerError,
    exc.InvalidTransitionError,
    exc.PricingError,
    exc.BudgetExceededError,
]


@pytest.mark.parametrize("cls", PHASES)
def test_every_error_of_the_package_is_caught_by_the_base_class(cls: type[Exception]) -> None:
    assert issubclass(cls, BatchProviderError)
    assert cls.__doc__


def test_a_refused_transition_is_a_ledger_error() -> None:
    assert issubclass(InvalidTransitionError, LedgerError)
    with pytest.raises(LedgerError):
        raise InvalidTransitionError("items cannot move from ['succeeded'] to 'staged'")


def test_an_item_error_names_the_position_the_id_and_keeps_its_parts() -> None:
    err = ItemError("fb-7", "item_too_large", "too big; shorten it.", position=3)
    assert str(err) == "record 3 (id 'fb-7'): too big; shorten it."
    assert (err.app_id, err.code, err.position) == ("fb-7", "item_too_large", 3)


def test_an_item_error_without_an_id_or_position_still_reads_as_a_sentence() -> None:
    assert (
        str(ItemError(None, "missing_id", "has no 'id' field.", position=0)) == "record 0: has no 'id' field."
    )
    assert str(ItemError(None, "missing_id", "has no 'id' field.")) == "record: has no 'id' field."
    assert str(ItemError("a", "c", "m.")) == "record (id 'a'): m."
