"""The cost preview the applying commands show before they ask (``launch``, ``resume``, ``failover``)
and ``plan`` prints: the numbers from ``cli.lifecycle.estimate``. No commands here."""


import typer

from cli.commands import progress


def shown(value) -> str:
    if isinstance(value, dict) and set(value) == {"type", "count"}:
        return f"{value['type']} x{value['count']}"
    return str(value)


def cost_preview(ref, cfg, jobs, expected_for=(), enabled: bool = True) -> dict:
    """The cost preview's numbers (``cli.lifecycle.estimate.preview``): $/h of ``jobs`` and the
    always-on parts, and the expected cost of the jobs in ``expected_for`` (a spinner while they replay)."""
    from cli.lifecycle import estimate
    from cli.lifecycle.capacity import learned_path, read_learned

    learned = dict(read_learned(learned_path(ref.path, ref.name)))
    expected = []
    for job in expected_for:
        with progress(f"job {job.id}: replaying its policy {job.policy} for the expected cost", enabled=enabled):
            found = estimate.expected_cost(cfg, job, learned)
        if found is not None:
            expected.append(found)
    return estimate.preview(cfg, jobs, expected)


def echo_cost(doc: dict, err: bool = False) -> None:
    from cli.commands.textfit import width
    from cli.lifecycle.estimate import render

    for line in render(doc, width()):
        typer.echo(line, err=err)


class JobCost:
    """One job's cost as the stack file has it when asked (after the edit): shown before the question of
    ``resume`` and ``failover`` (its $/h at its capacity now, the always-on parts, the expected cost under
    its policy, on stderr with Pulumi's preview) and given in their --json ($/h only: no replay)."""

    def __init__(self, stack, stack_file, job_id: str):
        self.stack, self.stack_file, self.job_id = stack, stack_file, job_id

    def _now(self):
        from cli.lifecycle import stackfile

        ref = stackfile.resolve(self.stack, self.stack_file)
        cfg = stackfile.load(ref)  # (whole: the always-on parts are the stack's)
        return ref, cfg, cfg.job(self.job_id)

    def before(self, confirm):
        def ask(question: str) -> bool:
            ref, cfg, job = self._now()
            echo_cost(cost_preview(ref, cfg, [job], [job]), err=True)
            return confirm(question)

        return ask

    def figures(self) -> dict:
        ref, cfg, job = self._now()
        return cost_preview(ref, cfg, [job], enabled=False)
