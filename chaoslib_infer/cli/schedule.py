"""``chaos-infer schedule``: a recurring game day as Kubernetes objects (YAML, nothing sent)."""

from __future__ import annotations

from pathlib import Path

import click

from chaoslib_infer import __version__
from chaoslib_infer.errors import InferChaosError

from .common import fail
from .usage import OneLineCommand

__all__ = ["schedule"]


@click.command(cls=OneLineCommand)
@click.option(
    "--cron",
    required=True,
    metavar="EXPR",
    help="CronJob schedule: 5 fields 'minute hour day-of-month month day-of-week' (cluster "
    "time zone), e.g. '0 3 * * 1' = Mondays 03:00; or @daily, @weekly...",
)
@click.option(
    "--plan",
    "plan_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Plan with platform: kubernetes (default drills/gameday-k8s.yaml).",
)
@click.option(
    "--target",
    "target_file",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="Kubernetes target file (its allowlist is checked now).",
)
@click.option(
    "--image",
    default=f"chaoslib-infer:{__version__}",
    show_default=True,
    help="Image with this package (build it from the Dockerfile, push it where the cluster "
    "pulls from).",
)
@click.option(
    "--namespace",
    default="chaos-infer",
    show_default=True,
    help="Namespace of the ServiceAccount, ConfigMap and CronJob.",
)
@click.option("--name", default="chaos-infer-gameday", show_default=True, help="CronJob name.")
@click.option(
    "--deadline-s",
    type=int,
    default=3600,
    show_default=True,
    help="activeDeadlineSeconds of each run.",
)
@click.option(
    "--evidence-pvc",
    default=None,
    metavar="CLAIM",
    help="PersistentVolumeClaim for /evidence (default: emptyDir, gone with the pod).",
)
@click.option(
    "--api-key-secret",
    default=None,
    metavar="SECRET",
    help="Secret whose key 'api-key' is the target's API key ($CHAOS_INFER_API_KEY).",
)
@click.option(
    "--history-secret",
    default=None,
    metavar="SECRET",
    help="Secret whose key 'url' is the team's history store (postgresql://USER:PASSWORD@HOST/DB, "
    "$CHAOS_INFER_HISTORY): every run is appended to it and compared with the last ones "
    "(default: /evidence/history.sqlite on --evidence-pvc, else no history).",
)
@click.option(
    "--out",
    "out_file",
    default="-",
    show_default=True,
    metavar="FILE|-",
    help="Where the YAML goes (- : stdout).",
)
def schedule(
    cron: str,
    plan_path: Path | None,
    target_file: Path,
    image: str,
    namespace: str,
    name: str,
    deadline_s: int,
    evidence_pvc: str | None,
    api_key_secret: str | None,
    history_secret: str | None,
    out_file: str,
) -> None:
    """Write a recurring game day as Kubernetes objects: ServiceAccount and RBAC (from
    deploy/rbac.yaml), a ConfigMap with the plan, target and experiments, and a CronJob running
    `chaos-infer gameday` from the project's image. Apply it with `kubectl apply -f FILE`.

    Nothing is sent to the cluster. Exit 2 (one line) on a bad cron expression, a plan that is
    not for Kubernetes, or a target outside its allowlist.
    """
    from chaoslib_infer.gameday import default_k8s_plan_path
    from chaoslib_infer.schedule import ScheduleSpec, build_schedule, dump_documents

    spec = ScheduleSpec(
        cron=cron,
        plan=plan_path or default_k8s_plan_path(),
        target=target_file,
        image=image,
        namespace=namespace,
        name=name,
        deadline_s=deadline_s,
        evidence_pvc=evidence_pvc,
        api_key_secret=api_key_secret,
        history_secret=history_secret,
    )
    try:
        docs = build_schedule(spec)
    except InferChaosError as exc:
        fail(str(exc))
        return
    except UnicodeDecodeError as exc:  # the --plan or --target file
        fail(f"--plan/--target: a file is not UTF-8 text (byte {exc.start})")
        return
    text = dump_documents(
        docs,
        f"chaos-infer {__version__} schedule --cron '{docs[-1]['spec']['schedule']}': "
        f"plan {spec.plan.name}, target {target_file.name}\napply: kubectl apply -f THIS_FILE",
    )
    if out_file == "-":
        click.echo(text, nl=False)
        return
    try:
        Path(out_file).write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"--out {out_file}: {exc.strerror or exc}")
        return
    kinds = ", ".join(d["kind"] for d in docs)
    click.echo(f"wrote {out_file}: {kinds}; apply with: kubectl apply -f {out_file}", err=True)
