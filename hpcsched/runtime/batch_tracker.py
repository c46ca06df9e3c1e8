"""The controller's side of adaptive batch sizes (``adaptive_batch``): one ``BatchFit`` per adaptive job, fed by its
progress reports, the batch each new attempt is told, and the goodput curve the MILP sizes the job by.

Everything it learns is also in the store (the progress rows keep each report's batch and statistics), so a
restarted controller refits a job from its rows the first time it needs the fit: nothing here is the only copy.
It is used under the controller's lock, like the store, except the step-time fits: one took 0.2-5 s on this
2-core machine at load 20, and under the lock it held heartbeats past a worker's lease (the worker stopped its
task). So a report that calls for a new fit (a new configuration) queues one on the tracker's own thread, and
decisions use the last fit until it is done (a job's first, "step-time fit not ready", gets the smallest batch).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor

from hpcsched.model import ScalingCurve
from hpcsched.runtime.adaptive_batch import BatchFit, choose_batch, goodput_curve
from hpcsched.runtime.rpc import pb
from hpcsched.runtime.store import Store
from hpcsched.runtime.store_rows import JobRow

log = logging.getLogger("hpcsched.runtime.controller")


class BatchTracker:
    """Fits, batches and curves of the adaptive jobs (module docstring)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._fits: dict[str, BatchFit] = {}
        self._fitter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-fit")
        self._fitting: dict[str, Future[None]] = {}  # job -> its queued or running step-time fit
        self._told: dict[str, int] = {}  # the batch each job's current (or last) attempt was told
        self._curves: dict[str, tuple[object, ScalingCurve | None]] = {}  # job -> (what it is of, curve)

    def _fit(self, job_id: str) -> BatchFit:
        fit = self._fits.get(job_id)
        if fit is None:  # first need since this controller started: refit from the stored reports
            fit = self._fits[job_id] = BatchFit()
            for row in self.store.progress(job_id):
                if row.get("batch_size"):
                    fit.add(row["batch_size"], row["world_size"] or 0, row["grad_sqr"] or 0.0, row["grad_var"] or 0.0,
                            (row["data_s"] or 0.0) + (row["compute_s"] or 0.0),
                            (row["data_s"] or 0.0) + (row["compute_s"] or 0.0) + (row["comm_s"] or 0.0))
            self._queue_fit(job_id, fit)
        return fit

    def _queue_fit(self, job_id: str, fit: BatchFit) -> None:
        """A step-time fit on the tracker's thread when the job's reports call for one and none is queued."""
        if fit.stale() and (job_id not in self._fitting or self._fitting[job_id].done()):
            self._fitting[job_id] = self._fitter.submit(self._refit, job_id, fit)

    @staticmethod
    def _refit(job_id: str, fit: BatchFit) -> None:
        try:
            fit.refit()  # reads a copy of the observations: ``steps`` may grow meanwhile (see ``fit_points``)
            while fit.stale():  # reports that came during the fit called for another (bounded: see ``fit_points``)
                fit.refit()
        except ImportError:  # no scipy: decisions say so (``adaptive_batch._function``)
            pass
        except Exception:  # a fit that fails leaves the last one in use; said, never raised into the controller
            log.exception("job %s: step-time fit failed", job_id)

    def wait_fits(self, timeout_s: float = 60.0) -> None:
        """Until the fits queued so far are done (tests; a controller never waits)."""
        self._fitter.submit(lambda: None).result(timeout=timeout_s)

    def close(self) -> None:
        self._fitter.shutdown(wait=False, cancel_futures=True)

    def observe(self, job: JobRow, p: pb.Progress) -> None:
        """One progress report of an adaptive job's current attempt (others are ignored). Pollux's step-time model
        has no data-loading term, so loading counts as compute (it scales with the per-process batch here)."""
        if job.spec.batch is None or p.batch_size <= 0:
            return
        busy = p.data_s + p.compute_s
        fit = self._fit(job.id)
        if fit.add(p.batch_size, p.world_size, p.grad_sqr, p.grad_var, busy, busy + p.comm_s):
            self._queue_fit(job.id, fit)

    def choose(self, job: JobRow, procs: int) -> int:
        """The global batch for the job's next attempt at ``procs`` (0 for a job without ``batch:``), with an event
        saying how it was chosen (goodput, or why the smallest batch allowed at that size)."""
        spec = job.spec.batch
        if spec is None:
            return 0
        fit = self._fit(job.id)
        c = choose_batch(spec, fit, procs, block=False)
        self._told[job.id] = c.batch
        noise = fit.noise_scale()
        self.store.event(job.id, "batch", procs=procs, batch_size=c.batch, how=c.how, noise_scale=noise,
                         goodput=c.goodput, reports=fit.reports)
        log.info("job %s: batch %d at %d procs (%s%s)", job.id, c.batch, procs, c.how,
                 f", noise scale {noise:.1f}" if noise is not None else "")
        return c.batch

    def curve(self, job: JobRow) -> ScalingCurve | None:
        """The job's goodput by size (useful samples/s at each size's best batch) once fitted, for an elastic job
        with ``batch:`` and a declared scaling curve (the MILP sizes only those; this replaces the declared one);
        None otherwise. Refitted when new reports came in."""
        spec = job.spec.batch
        if spec is None or not job.spec.curve_procs or job.spec.min_procs == job.spec.max_procs:
            return None
        fit = self._fit(job.id)
        got = self._curves.get(job.id)
        seen = (fit.reports, fit.perf[0] if fit.perf is not None else None)
        if got is not None and got[0] == seen:
            return got[1]
        sizes, rates = goodput_curve(spec, fit, range(job.spec.min_procs, job.spec.max_procs + 1), block=False)
        curve = ScalingCurve(tuple(float(n) for n in sizes), rates) if sizes and all(r >= 0 for r in rates) else None
        self._curves[job.id] = (seen, curve)
        return curve

    def shown(self) -> dict[str, tuple[int, float]]:
        """job -> (batch told, noise scale or 0) for the listing (``JobInfo.batch_size``, ``noise_scale``)."""
        return {j: (b, (self._fits[j].noise_scale() or 0.0) if j in self._fits else 0.0)
                for j, b in self._told.items()}

    def forget(self, job_id: str) -> None:
        """A job that ended: its fit stays in the store, not in memory."""
        self._fits.pop(job_id, None)
        self._fitting.pop(job_id, None)
        self._told.pop(job_id, None)
        self._curves.pop(job_id, None)
