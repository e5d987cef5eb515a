"""Type stubs of fanout's native module (PyO3). Use the names re-exported by ``fanout``."""

import pathlib
from os import PathLike
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

_Path = Union[str, PathLike[str]]

EVAL_EPOCH: int
"""The epoch number fanout's trainer samples evaluation batches under (2**64 - 1)."""
CUDA_BUILT: bool
"""Whether this package was built with CUDA support (``train(..., device="cuda")``)."""
__version__: str

class FanoutError(Exception):
    """Base class of every error fanout raises."""

class DatasetError(FanoutError):
    """A dataset file is damaged or does not match meta.txt (the message names the file)."""

class InvalidArgumentError(FanoutError, ValueError):
    """A bad argument or setting."""

class NotFoundError(FanoutError, FileNotFoundError):
    """A path that does not exist."""

class FanoutIOError(FanoutError, OSError):
    """An operating-system error while reading or writing."""

class DeviceError(FanoutError, RuntimeError):
    """The device asked for cannot be opened (no CUDA in this build, no driver, no such GPU)
    or failed during the run (out of memory)."""

class Dataset:
    """An opened fanout dataset directory (memory-mapped; O(1) to open).

    Every array property is a read-only numpy view of the dataset's memory-mapped files: no
    copy is made, and the array's ``base`` is this object, which keeps the maps alive.
    """

    def __init__(self, path: _Path) -> None: ...
    @property
    def path(self) -> pathlib.Path: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def num_edges(self) -> int:
        """Stored arcs."""
    @property
    def feat_dim(self) -> int: ...
    @property
    def num_classes(self) -> int: ...
    @property
    def feat_dtype(self) -> str:
        """``"float32"`` or ``"float16"``."""
    @property
    def layout(self) -> str:
        """``"csc"`` (rows list in-neighbours) or ``"csr"``."""
    @property
    def features(self) -> Optional[npt.NDArray[Any]]:
        """``[num_nodes, feat_dim]`` float32/float16 view of feat.bin, or ``None``."""
    @property
    def labels(self) -> Optional[npt.NDArray[np.int64]]:
        """``[num_nodes]`` int64 (-1 = unlabelled), or ``None``."""
    @property
    def train_idx(self) -> npt.NDArray[np.uint32]: ...
    @property
    def valid_idx(self) -> npt.NDArray[np.uint32]: ...
    @property
    def test_idx(self) -> npt.NDArray[np.uint32]: ...
    @property
    def indptr(self) -> npt.NDArray[Any]:
        """``[num_nodes + 1]`` uint32/uint64 offsets."""
    @property
    def indices(self) -> npt.NDArray[Any]:
        """``[num_edges]`` uint32/uint64 neighbour ids."""
    def in_degrees(self) -> npt.NDArray[np.uint64]: ...
    def info(self) -> Dict[str, Any]:
        """What ``fanout dataset info --json`` prints."""
    def __len__(self) -> int: ...

def verify(path: str) -> Dict[str, Any]: ...
def import_dataset(format: str, src: str, dst: str, options: Dict[str, Any]) -> Dict[str, Any]: ...

class _Loader:
    def __init__(
        self,
        dataset: Dataset,
        seeds: npt.NDArray[np.uint32],
        fanouts: List[int],
        batch_size: int,
        shuffle: bool,
        sampler: Dict[str, Any],
        cache: Optional[Dict[str, Any]],
        prefetch: int,
        seed: int,
        num_threads: Optional[int],
    ) -> None: ...
    def __len__(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def cache(self) -> Optional[Dict[str, Any]]: ...
    def take_times(self) -> Tuple[float, float]: ...
    def epoch(self, epoch: int) -> _Epoch: ...

class _Epoch:
    def __iter__(self) -> Iterator[Dict[str, Any]]: ...
    def __next__(self) -> Dict[str, Any]:
        """A batch: ``epoch``, ``step``, ``num_seeds``, ``input_nodes``, ``features``,
        ``labels``, ``blocks`` (dicts of ``num_src``, ``num_dst``, ``indptr``, ``indices``,
        ``weights``), ``extract`` and ``_addresses``."""
    def __len__(self) -> int: ...
    def close(self) -> None: ...

def train(
    config: Optional[Dict[str, Any]] = None,
    config_path: Optional[str] = None,
    save_model: Optional[str] = None,
    metrics_out: Optional[str] = None,
    on_epoch: Optional[Callable[[Dict[str, Any]], None]] = None,
    on_note: Optional[Callable[[str], None]] = None,
    device: str = "cpu",
) -> Dict[str, Any]: ...
def evaluate(
    checkpoint: str,
    dataset: Optional[str] = None,
    split: str = "test",
    feature_residency: str = "auto",
    device: str = "cpu",
) -> float: ...
def read_checkpoint(
    path: str,
) -> Tuple[Dict[str, str], Dict[str, Any], Dict[str, npt.NDArray[np.float32]]]: ...
def report(
    out: str,
    text: Optional[str] = None,
    path: Optional[str] = None,
) -> str: ...
