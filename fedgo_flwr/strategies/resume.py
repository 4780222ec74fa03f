"""A strategy's checkpoint and a resumed `start` (docs/library.md, "Resuming a run"): what the
method carries from round to round (`carried`: modules, optimisers and schedulers by their
state_dict, anything else as is), the clients' method's state and the rounds done; a resumed
`start` counts its rounds on from them."""

from __future__ import annotations


def carried_state(strategy) -> dict:
    """What a run resumed after the last round aggregated needs besides the global model."""
    state = {"rounds_done": strategy.last_round, **{
        name: value.state_dict() if hasattr(value, "state_dict") else value
        for name in strategy.carried for value in [getattr(strategy, name)]}}
    if strategy.client_method is not None:
        state["client_method"] = strategy.client_method.state_dict()
    return state


def load_carried(strategy, state: dict) -> None:
    """Go on from a `carried_state`: the next `start` runs the rounds after it."""
    strategy.rounds_done = strategy.last_round = state["rounds_done"]
    if strategy.client_method is not None:
        strategy.client_method.load_state_dict(state["client_method"])
    for name in strategy.carried:
        if hasattr(current := getattr(strategy, name), "load_state_dict"):
            current.load_state_dict(state[name])
        else:
            setattr(strategy, name, state[name])


def in_run_rounds(evaluate_fn, rounds_done: int):
    """Flower's `evaluate_fn` of a resumed run: given the run's round, not called for the
    model it resumes from (evaluated before its checkpoint)."""
    if evaluate_fn is None or not rounds_done:
        return evaluate_fn
    return lambda server_round, arrays: (evaluate_fn(server_round + rounds_done, arrays)
                                         if server_round else None)
