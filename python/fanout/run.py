"""fanout's own trainer and evaluator, through the Rust run API."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _fanout
from ._fanout import InvalidArgumentError
from .loader import _cache_spec

__all__ = ["evaluate", "read_checkpoint", "report", "train"]

PathLike = Union[str, "os.PathLike[str]"]


def _print_epoch(m: Dict[str, Any]) -> None:
    acc = lambda a: "-" if a is None else f"{a:.4f}"  # noqa: E731
    print(
        f"epoch {m['epoch']:>3}  {m['wall_s']:>7.2f}s  sample {m['sample_s']:.2f}s  "
        f"extract {m['extract_s']:.2f}s  train {m['train_s']:.2f}s  loss {m['loss']:.4f}  "
        f"train_acc {m['train_acc']:.4f}  val_acc {acc(m['val_acc'])}  "
        f"test_acc {acc(m['test_acc'])}",
        file=sys.stderr,
    )


def train(
    config: Union[Mapping[str, Any], PathLike, None] = None,
    *,
    device: str = "cpu",
    save_model: Optional[PathLike] = None,
    metrics_out: Optional[PathLike] = None,
    on_epoch: Optional[Callable[[Dict[str, Any]], None]] = None,
    verbose: bool = False,
    **settings: Any,
) -> Dict[str, Any]:
    """Trains a model with fanout's own trainer (``fanout train``) and returns its metrics.

    ``config`` is a run config: a dict with the keys of ``fanout train --config``'s files
    (``dataset``, ``model`` = ``"sage"|"gcn"|"gat"|"gin"|"pinsage"``, ``fanouts``,
    ``batch_size``, ``hidden``, ``epochs``, ``lr``, ``weight_decay``, ``dropout``, ``seed``,
    ``threads``, ``eval_every``, ``prefetch``, ``sampler``, ``cache``, ``workers``, ...), or
    the path of a TOML/JSON config (or of an earlier run's metrics JSON, which replays it).
    Keyword ``settings`` are added to (or override) a dict config. Unknown keys are refused.

    ``device`` is where the model trains: ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (what
    ``fanout train --device`` takes). A GPU needs a package built with CUDA support
    (``MATURIN_PEP517_ARGS="--features cuda" pip install ./python``; no CUDA toolkit needed
    to build) and the NVIDIA driver; a device that cannot be opened raises
    :class:`DeviceError` saying what is missing, and a GPU asked for is never replaced by the
    CPU. On a GPU, k-hop sampling and the feature rows move there too when they fit
    (``sampling_placement``, ``feature_placement``; docs/cuda.md).

    ``save_model`` (also accepted as a config key) writes the best-validation model as a
    safetensors checkpoint (``fanout eval``, :func:`evaluate`,
    :func:`fanout.torch.load_checkpoint`); ``metrics_out`` (also a key) writes the metrics
    JSON; given both ways, the keyword must agree with the key. ``on_epoch(metrics)`` is
    called after every epoch; ``verbose`` prints a line per epoch on stderr. Training runs on
    Rust threads with the GIL released; Ctrl-C (``KeyboardInterrupt``), or an exception
    raised by ``on_epoch``, stops the run before its next training step and is raised here
    (so ``on_epoch`` can end a run early).

    Returns the metrics report: ``test_acc`` (of the best-validation epoch), ``best_val_acc``,
    ``best_epoch``, ``median_epoch_s``, ``epochs`` (per-epoch figures), the resolved
    ``config`` and the ``device`` it computed on (kind, name, memory).
    """
    path: Optional[str] = None
    cfg: Optional[Dict[str, Any]] = None
    if config is None:
        cfg = {}
    elif isinstance(config, Mapping):
        cfg = dict(config)
    elif isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if settings:
            raise InvalidArgumentError(
                "settings given as keywords need a dict config (a config file is used as it is)"
            )
    else:
        raise InvalidArgumentError(
            f"config: expected a dict or a path, got {type(config).__name__}"
        )
    if cfg is not None:
        cfg.update(settings)
        save_model = _one_output(cfg, "save_model", save_model)
        metrics_out = _one_output(cfg, "metrics_out", metrics_out)
        for k in ("dataset",):
            if cfg.get(k) is not None:
                cfg[k] = os.fsdecode(cfg[k])
                _check_utf8(k, cfg[k])
        if cfg.get("cache") is not None:
            # The loader's cache dict, a float ratio included, is a run config's [cache] too.
            cfg["cache"] = _cache_spec(cfg["cache"])
    callbacks = []
    if on_epoch is not None:
        callbacks.append(on_epoch)
    if verbose:
        callbacks.append(_print_epoch)

    def each_epoch(m: Dict[str, Any]) -> None:
        for cb in callbacks:
            cb(m)

    def note(line: str) -> None:
        print(line, file=sys.stderr)

    return _fanout.train(
        cfg,
        path,
        None if save_model is None else os.fspath(save_model),
        None if metrics_out is None else os.fspath(metrics_out),
        each_epoch if callbacks else None,
        note if verbose else None,
        device,
    )


def _check_utf8(key: str, path: str) -> None:
    """Refuses a path that is not valid UTF-8 (os.fsdecode leaves its bytes as surrogate
    escapes), as ``fanout train`` does: the config goes through JSON, which holds text."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(
            f"{key} {path!r}: the path is not valid UTF-8, and a run's config and metrics JSON "
            "hold it as text; rename the folder, or link to it under a UTF-8 name"
        ) from None


def _one_output(cfg: Dict[str, Any], key: str, keyword: Optional[PathLike]) -> Optional[PathLike]:
    """The output path given as config key ``key`` or as the keyword of the same name (taken
    out of ``cfg``); refuses two different ones rather than silently writing only one."""
    in_cfg = cfg.pop(key, None)
    if in_cfg is None:
        return keyword
    if keyword is not None and os.fspath(keyword) != os.fspath(in_cfg):
        raise InvalidArgumentError(
            f"{key} given twice: {os.fspath(in_cfg)!r} in the config and {os.fspath(keyword)!r} "
            "as a keyword; give one"
        )
    return in_cfg


def evaluate(
    checkpoint: PathLike,
    dataset: Optional[PathLike] = None,
    split: str = "test",
    *,
    feature_residency: str = "auto",
    device: str = "cpu",
) -> float:
    """The accuracy of a saved model on ``split`` (``"test"``, ``"valid"`` or ``"train"``) of
    ``dataset`` (default: the embedded graph ``fanout train`` uses without a dataset), sampled
    with the fanouts, batch size, seed and sampler stored in the checkpoint, so it equals the
    test accuracy its training run reported (``fanout eval``). ``device`` is where the model
    computes, as for :func:`train`."""
    return _fanout.evaluate(
        os.fspath(checkpoint),
        None if dataset is None else os.fspath(dataset),
        split,
        feature_residency,
        device,
    )


def read_checkpoint(
    path: PathLike,
) -> Tuple[Dict[str, str], Dict[str, Any], Dict[str, np.ndarray]]:
    """Reads a fanout checkpoint (safetensors) as ``(metadata, model_config, tensors)``.

    ``tensors`` maps ``layers.{i}.{param}`` to float32 arrays ``[rows, cols]``; weights are
    stored ``in x out`` (the transpose of ``torch.nn.Linear.weight``) and biases ``1 x out``.
    ``model_config`` has ``kind``, ``in_dim``, ``hidden``, ``num_classes``, ``num_layers``,
    ``dropout``, ``heads`` and ``seed``; ``metadata`` the run's settings (``train.fanouts``,
    ``train.batch_size``, ``train.seed``, ``train.config``). The file is checked as
    ``fanout eval`` checks it.
    """
    return _fanout.read_checkpoint(os.fspath(path))


def report(
    metrics: Union[Mapping[str, Any], Sequence[Mapping[str, Any]], PathLike],
    out: Optional[PathLike] = None,
) -> str:
    """Draws a run's metrics as a picture, as ``fanout report`` does, and returns its path.

    ``metrics`` is what :func:`train` returned, the path of a metrics JSON (``metrics_out=``,
    ``fanout train --metrics-out``), or cache-sim rows (the dicts of ``fanout cache-sim
    --json``, or the path of its output). A training run becomes four panels: the stages'
    busy time per epoch, stacked, with the epoch's wall time and its compute and memory
    floors as lines; the loss; train and validation accuracy; the share of feature bytes
    served by the cache and by Match-Reorder's reuse. Cache-sim rows become hit rate against
    cache ratio, one line per policy.

    ``out`` is the picture: a name ending in ``.svg`` or ``.png`` (default: the metrics
    path with ``.svg``; required when ``metrics`` is not a path). It is written under a
    temporary name and renamed, so an existing picture is never left half-written. A bad
    name, a name that is the metrics file's own, or metrics missing a field the pictures
    need raise :class:`InvalidArgumentError` (naming the field) before anything is written;
    a missing metrics file :class:`NotFoundError`; a file that cannot be read or a picture
    that cannot be written :class:`FanoutIOError`.
    """
    def as_json(obj: Mapping[str, Any]) -> str:
        try:
            return json.dumps(dict(obj))
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"metrics: not JSON ({e})") from None

    text: Optional[str] = None
    path: Optional[str] = None
    if isinstance(metrics, (str, bytes, os.PathLike)):
        path = os.fsdecode(metrics)
        if out is None:
            out = os.path.splitext(path)[0] + ".svg"
    elif isinstance(metrics, Mapping):
        text = as_json(metrics)
    elif isinstance(metrics, (list, tuple)) and all(isinstance(r, Mapping) for r in metrics):
        text = "\n".join(as_json(r) for r in metrics)
    else:
        raise InvalidArgumentError(
            "metrics: expected the dict fanout.train returned, cache-sim rows (a list of "
            f"dicts) or a path, got {type(metrics).__name__}"
        )
    if out is None:
        raise InvalidArgumentError(
            "out: a picture name ending in .svg or .png is needed when the metrics are not a file"
        )
    out = os.fsdecode(out)
    _fanout.report(out, text, path)
    return out
