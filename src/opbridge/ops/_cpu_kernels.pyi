# Type stub of the C extension built from _cpu_kernels.c.
from typing import Any
from typing import Any as Buffer

def channel_stride(C: int, /) -> int: ...
def to_channels_last(x: Buffer, xt: Buffer, C: int, S: int, HW: int, r0: int, r1: int, /) -> None: ...
def grid_sample(
    xt: Buffer,
    grid: Buffer,
    out: Buffer,
    C: int,
    S: int,
    H: int,
    W: int,
    P: int,
    mode: int,
    padding: int,
    align: bool,
    p0: int,
    p1: int,
    /,
) -> None: ...
def grid_sample_planes(
    x: Buffer,
    grid: Buffer,
    out: Buffer,
    C: int,
    H: int,
    W: int,
    P: int,
    mode: int,
    padding: int,
    align: bool,
    p0: int,
    p1: int,
    /,
) -> None: ...
def planes_apply(C: int, H: int, W: int, mode: int, /) -> bool: ...
def resize_bicubic(
    x: Buffer,
    out: Buffer,
    planes: int,
    H: int,
    W: int,
    Ho: int,
    Wo: int,
    align: bool,
    p0: int,
    p1: int,
    oy0: int,
    oy1: int,
    /,
) -> None: ...
def roi_align(
    xt: Buffer,
    rois: Buffer,
    out: Buffer,
    N: int,
    C: int,
    H: int,
    W: int,
    R: int,
    PH: int,
    PW: int,
    spatial_scale: float,
    sampling_ratio: int,
    pool_max: bool,
    aligned: bool,
    r0: int,
    r1: int,
    /,
) -> None: ...
def grid_sample_native(mode: int, padding: int, align: bool, min_channels: int, /) -> Any: ...
def resize_bicubic_native(align: bool, /) -> Any: ...
def roi_align_native(
    output_height: int, output_width: int, spatial_scale: float, sampling_ratio: int, pool_max: bool, aligned: bool, /
) -> Any: ...
