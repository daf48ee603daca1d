"""--mode serve: the run's report.html and a JSON forecast API over HTTP (Starlette + uvicorn).

GET /                   <workdir>/report.html
GET /health             {"status": "ok", "model", "series": n, "workdir": its folder name}
GET /series             the series with a loaded model, with their training facts
GET /forecast/{series}  a fresh forecast of the next H candles (forecast.json's entry, with
                        age_intervals: 1 = from the newest closed candle, more = stale)
POST /forecast/{series} the same from the candles in the body, {"candles": [{"open_time":
                        ms or ISO-8601, "open": ..., "high", "low", "close", "volume",
                        and each data.covariates column: number or null}, ...]}, checked
                        as Model.predict checks a frame (cpbjax/data/frames.py)

The models are loaded once at start (cpbjax/score/saved.py, as --mode predict loads them).
A GET loads the newest data of its series from the config's data location and runs the
same `forecast.next_candles` as --mode predict; a POST forecasts from the candles it
sends, as `Model.predict` does from a frame: that is how a covariate model is given its
newest covariates. A POST body over http_server.MAX_BODY_BYTES or MAX_POST_CANDLES
candles is a 413, one that is not such JSON a 400, and candles that fail a check (too
few, a gap, NaN, a covariate column absent or missing in the newest window) a 422.
Only the names of loaded models are accepted: anything else is a 404 (a well-formed
name) or a 400 (a malformed one), always with a JSON message, never a traceback (a name
is echoed back cut to NAME_ECHO_CHARS). A series whose saved model was unreadable at
start (damaged: it fails its manifest) is a 503 naming the file, and a forecast of NaN
or inf prices a 500 naming the series. It binds to serve.host (127.0.0.1 by default);
cpbjax/modes/http_server.py runs the server and stops it cleanly on SIGTERM or Ctrl-C.

Forecasts never hold up the cheap endpoints or shutdown: each runs in its own daemon
thread, at most MAX_FORECASTS at a time (more get 503 at once), apart from the thread
pool of /series and the event loop of /health. Their slots are freed at the deadline:
the data load under the forecast lock ends at the data sources' own deadlines (over
HTTP, data.timeout_seconds a request and data.download_deadline_s a file, and a host
that does not answer in time has the rest skipped), and a forecast waits for that lock
at most data.download_deadline_s, then is answered 503. On SIGTERM every forecast still
waiting is answered 503 within POLL_S and the server exits (uvicorn's graceful shutdown
is capped at http_server.SHUTDOWN_GRACE_S); the abandoned daemon threads do not keep the
process alive. A connection that has not sent a whole request head within
http_server.HEADER_TIMEOUT_S is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import threading
import time

from absl import logging
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Route

from cpbjax import workdir as workdir_lib
from cpbjax.config_rules import ConfigError
from cpbjax.data import frames, klines_api, parsing
from cpbjax.data.series import SeriesSkipped
from cpbjax.modes import http_server, predict, trained_run
from cpbjax.score import forecast, saved, zero_shot

# SYMBOL-INTERVAL, as models/<SERIES>/ names them (e.g. BTCUSDT-1h).
_SERIES_RE = re.compile(r"^[A-Z0-9]{2,20}-[0-9]{1,2}[mhdwM]$")


PATHS = ("/", "/health", "/series", "/forecast/{series}")
# POST bodies: a year of 1h candles, or two weeks of 1m ones, with room for covariates.
MAX_POST_CANDLES = 20_000
MAX_FORECASTS = 4  # forecasts in flight (running or waiting for the lock); more get 503
POLL_S = 0.2  # how often a waiting forecast request looks for a shutdown
NAME_ECHO_CHARS = 64  # of a requested name echoed in an error message


def _echo(name: str) -> str:
    """`name` for an error message: repr, cut to NAME_ECHO_CHARS characters."""
    cut = name[:NAME_ECHO_CHARS]
    return repr(cut) + (f"... ({len(name)} characters)" if len(name) > NAME_ECHO_CHARS else "")


class BadCandles(ValueError):
    """A POST's candles fail a check; the message names it (answered 422)."""


class Busy(RuntimeError):
    """Another forecast held the forecast lock for longer than a forecast waits for it."""


class Forecaster:
    """The loaded models of a workdir, and fresh forecasts of their series.

    Args:
      config: the given config (data location, predict.symbols/intervals, serve).
      workdir: the trained run.

    Raises:
      saved.ModelNotFound: no requested model exists or could be read.
    """

    def __init__(self, config, workdir: str):
        self.models, self.config, self.unreadable = trained_run.load_for_forecast(config, workdir)
        self.workdir = workdir
        self._lock = threading.Lock()  # one forecast at a time: each one uses every core

    def series(self) -> list[dict]:
        """One entry per loaded model: name, symbol, interval and its training facts."""
        scored = predict.scored_series(self.workdir)
        out = []
        for name in self.models:
            entry = scored.get(name, {})
            close = ((entry.get("test") or {}).get("columns") or {}).get("close") or {}
            symbol, interval = saved.parse_series(name)
            out.append(
                {
                    "name": name,
                    "symbol": symbol,
                    "interval": interval,
                    "status": entry.get("status"),
                    "best_epoch": entry.get("best_epoch"),
                    "test_close_skill": close.get("skill"),
                }
            )
        return out

    def forecast(self, name: str) -> dict:
        """A fresh forecast of `name` (a loaded model) from the newest data.

        Raises:
          SeriesSkipped: its data cannot be loaded or is too short for one window.
          Busy: the forecast lock stayed held for data.download_deadline_s.
        """
        cfg = trained_run.forecast_config(self.config, self.models[name].trained, [name])
        wait_s = cfg.data.download_deadline_s
        if not self._lock.acquire(timeout=wait_s):
            raise Busy(f"another forecast has loaded data for over {wait_s:g} s; retry later")
        try:
            preps, skipped = trained_run.prepare(cfg, {name: self.models[name]}, latest=True)
            if name not in preps:
                raise SeriesSkipped(skipped.get(name, "no usable data"))
            model = self.models[name]
            entry = forecast.next_candles(
                model.module,
                model.params,
                preps[name],
                cfg.data.lookback,
                cfg.data.horizon,
                model.calibration,
            )
        finally:
            self._lock.release()
        predict.freshness(entry, klines_api.clock_ms(), cfg.data.source)  # > 1 is stale
        return self._answer(name, entry)

    def forecast_candles(self, name: str, candles) -> dict:
        """A forecast of `name` (a loaded model) from `candles` (a frame of the newest
        candles, frames.records_frame), checked as Model.predict checks a frame.

        Raises:
          BadCandles: the candles fail a check (too few, a gap, NaN, a covariate column
            absent or missing in the newest window, ...), naming it.
          Busy: as `forecast`.
        """
        model = self.models[name]
        d = model.trained.data
        symbol, interval = saved.parse_series(name)
        wait_s = self.config.data.download_deadline_s
        if not self._lock.acquire(timeout=wait_s):
            raise Busy(f"another forecast has run for over {wait_s:g} s; retry later")
        try:
            series = frames.candles_to_series(
                candles, symbol, interval, frames.volume_features(d), d.covariates
            )
            entry = zero_shot.from_candles(model, series)
        except forecast.NonFiniteForecast:  # the model's fault, not the candles' (a 500)
            raise
        except (ValueError, TypeError, SeriesSkipped) as e:  # CovariateError too
            raise BadCandles(str(e)) from None
        finally:
            self._lock.release()
        predict.freshness(entry, klines_api.clock_ms(), "posted", warn=False)
        return self._answer(name, entry)

    def _answer(self, name: str, entry: dict) -> dict:
        """The JSON answer of a next_candles entry of `name`."""
        trained = self.models[name].trained
        scored = predict.scored_series(self.workdir).get(name)
        return {
            "series": name,
            "model": trained.model.name,
            "horizon": trained.data.horizon,
            "created": parsing.iso(time.time() * 1000),
            **predict.described(entry, scored, trained.model.baseline),
        }


def _error(status: int, message: str, **extra) -> JSONResponse:
    return JSONResponse({"error": message, "status": status, **extra}, status_code=status)


class _Handlers:
    """The route handlers over one Forecaster, sharing its forecast slots and stop flag."""

    def __init__(self, forecaster: Forecaster):
        self.forecaster = forecaster
        self.report = workdir_lib.report_html(forecaster.workdir)
        self.slots = threading.BoundedSemaphore(MAX_FORECASTS)  # released by the forecast's thread
        self.stopping = threading.Event()

    async def index(self, request: Request):
        if not os.path.exists(self.report):
            return _error(404, f"no report at {self.report}: train with this --workdir first")
        return FileResponse(self.report, media_type="text/html")

    async def health(self, request: Request):
        f = self.forecaster
        return JSONResponse(
            {
                "status": "ok",
                "model": f.config.model.name,
                "series": len(f.models),
                "workdir": os.path.basename(os.path.abspath(f.workdir)),
            }
        )

    async def series(self, request: Request):
        items = await run_in_threadpool(self.forecaster.series)
        return JSONResponse({"series": items, "unreadable": self.forecaster.unreadable})

    async def forecast_one(self, request: Request):
        name = request.path_params["series"]
        refused = self._refused(name)
        if refused is not None:
            return refused
        return await self._forecast(name, self.forecaster.forecast, name)

    async def forecast_posted(self, request: Request):
        name = request.path_params["series"]
        refused = self._refused(name)
        if refused is not None:
            return refused
        try:
            candles = frames.records_frame(await _posted_records(request))
        except http_server.BadBody as e:
            return _error(e.status, f"{name}: {e}")
        except ValueError as e:
            return _error(400, f"{name}: {e}")
        return await self._forecast(name, self.forecaster.forecast_candles, name, candles)

    def _refused(self, name: str) -> JSONResponse | None:
        """The error answer for a series name no loaded model forecasts; None if one does."""
        if not _SERIES_RE.match(name):
            return _error(400, f"malformed series name {_echo(name)}: expected e.g. BTCUSDT-1h")
        if name in self.forecaster.unreadable:  # damaged: refused at load, with its reason
            return _error(503, f"{name}: {self.forecaster.unreadable[name]}")
        if name not in self.forecaster.models:
            return _error(
                404, f"unknown series {_echo(name)}", series=sorted(self.forecaster.models)
            )
        return None

    async def _forecast(self, name: str, fn, *args):
        """fn(*args)'s forecast as the answer, in a forecast slot; each failure its status."""
        if not self.slots.acquire(blocking=False):
            return _error(503, f"{name}: {MAX_FORECASTS} forecasts in progress; retry later")
        try:
            call = functools.partial(fn, *args)
            return JSONResponse(await _in_daemon_thread(call, name, self.slots, self.stopping))
        except (SeriesSkipped, BadCandles) as e:
            return _error(422, f"{name}: cannot forecast: {e}")
        except forecast.NonFiniteForecast as e:  # the model's fault, not the request's
            logging.warning("%s", e)
            return _error(500, str(e))
        except (OSError, ConfigError) as e:  # the data location is unreachable or unusable
            return _error(503, f"{name}: cannot load its data: {e}")
        except Busy as e:
            return _error(503, f"{name}: {e}")
        except _ShuttingDown:
            return _error(503, f"{name}: the server is shutting down; the forecast was dropped")


async def _posted_records(request: Request) -> list:
    """The "candles" list of a POST's JSON body (http_server.json_body's limits).

    Raises:
      http_server.BadBody: over the limits, not JSON, not an object with a "candles"
        list (400), or over MAX_POST_CANDLES candles (413).
    """
    payload = await http_server.json_body(request)
    if not isinstance(payload, dict) or not isinstance(payload.get("candles"), list):
        raise http_server.BadBody(400, 'the body must be a JSON object {"candles": [...]}')
    if len(payload["candles"]) > MAX_POST_CANDLES:
        count = len(payload["candles"])
        raise http_server.BadBody(413, f"{count} candles; at most {MAX_POST_CANDLES}")
    return payload["candles"]


async def _http_error(request: Request, exc: HTTPException):
    if exc.status_code == 404:  # no route matched
        return _error(404, f"no such path {request.url.path!r}", paths=list(PATHS))
    return _error(exc.status_code, exc.detail or "error")


async def _server_error(request: Request, exc: Exception):
    # uvicorn logs the traceback (Starlette re-raises after this); the client gets none.
    return _error(500, f"internal error ({type(exc).__name__}); see the server log")


def build_app(forecaster: Forecaster) -> Starlette:
    """The Starlette app over one Forecaster (see the module docstring for the routes).

    app.state.stopping (a threading.Event), once set, answers waiting forecasts 503.
    """
    h = _Handlers(forecaster)
    routes = [
        Route("/", h.index, methods=["GET"]),
        Route("/report.html", h.index, methods=["GET"]),
        Route("/health", h.health, methods=["GET"]),
        Route("/series", h.series, methods=["GET"]),
        Route("/forecast/{series:str}", h.forecast_one, methods=["GET"]),
        Route("/forecast/{series:str}", h.forecast_posted, methods=["POST"]),
    ]
    handlers = {HTTPException: _http_error, Exception: _server_error}
    app = Starlette(routes=routes, exception_handlers=handlers)
    app.state.stopping = h.stopping
    return app


class _ShuttingDown(Exception):
    """The server is stopping; a waiting forecast is answered 503."""


async def _in_daemon_thread(fn, name: str, slots: threading.BoundedSemaphore, stopping):
    """fn() (the forecast of `name`) in a new daemon thread that releases `slots` when done; its result.

    Raises:
      _ShuttingDown: `stopping` was set first (the thread is left to finish alone).
    """
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def settle(result, error):
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def work():
        try:
            result, error = fn(), None
        except Exception as e:  # handed to the request's coroutine
            result, error = None, e
        finally:
            slots.release()
        with contextlib.suppress(RuntimeError):  # the server stopped and closed its loop
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name=f"forecast {name}", daemon=True).start()
    while not stopping.is_set():
        finished, _ = await asyncio.wait({done}, timeout=POLL_S)
        if finished:
            return done.result()
    raise _ShuttingDown


def run_serve(config, workdir: str) -> None:
    """Loads the models of `workdir` and serves them on config.serve.host:port until stopped.

    Raises:
      saved.ModelNotFound: the workdir has no usable model.
      http_server.ServeError: the server could not start.
    """
    forecaster = Forecaster(config, workdir)
    host, port = config.serve.host, config.serve.port
    logging.info(
        "serving %d series of %s on http://%s:%d/ (report at /, API at /health, /series, "
        "/forecast/<SERIES>)",
        len(forecaster.models),
        workdir,
        host,
        port,
    )
    http_server.serve(build_app(forecaster), host, port)
    logging.info("server on %s:%d stopped", host, port)
    http_server.leave_waiting_forecasts()
