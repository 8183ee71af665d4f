"""``hurray-schema convert SOURCE DESTINATION``: safetensors (a file or a Hugging Face model folder),
GGUF or a PyTorch Distributed Checkpoint folder into Hurray, Hurray into safetensors, a model
folder or a Distributed Checkpoint folder, by :func:`hurray_schema.conversion.convert`, whose report is printed (``--json``: as its JSON
object, schema ``hurray-schema/convert/1``)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Optional

import click

from ..errors import HurraySchemaError
from .common import Bytes, fail, progress_threshold


@click.command()
@click.argument("source", type=click.Path(exists=True))
@click.argument("destination", type=click.Path())
@click.option("--to", "to", type=click.Choice(["hurray", "safetensors", "hf", "dcp"]), default=None,
              help="Output format (default: a model folder (hf) with --max-shard-size or when DESTINATION is an "
                   "existing folder, else from DESTINATION's extension, .safetensors or else Hurray; dcp: a "
                   "PyTorch Distributed Checkpoint folder).")
@click.option("--ranks", "ranks", type=click.IntRange(min=1), default=None,
              help="Into a Distributed Checkpoint (--to dcp): the __<rank>_0.distcp files, member i of each "
                   "partition in rank i mod RANKS's (default 1).")
@click.option("--max-shard-size", "max_shard_size", type=Bytes(), default=None,
              help="Into a model folder: the largest shard, as huggingface_hub cuts them (e.g. 2GB; default 5GB).")
@click.option("--quantized-as", "quantized_as", default=None, metavar="METHOD",
              help="Into a model folder: write quantized tensors as this method's parts (compressed-tensors, "
                   "gptq, awq, bitsandbytes, hqq, quanto; default the method of the carried config.json).")
@click.option("--dequantize", is_flag=True,
              help="Store tensors that have no exact Hurray form decoded, exactly: GGUF types (Q4_1, Q5_1, "
                   "Q2_K, Q4_K, Q5_K, IQ2/IQ3/IQ1 ...) as float32, a quantized checkpoint's linears as its "
                   "library's dequantization, in its dtype.")
@click.option("--requantize", metavar="SCHEME[:storage]", default=None,
              help="Quantize those tensors again instead (per_block, per_channel, per_tensor, nf4, mxfp).")
@click.option("--quantize", metavar="SCHEME[:storage]", default=None,
              help="Quantize 2-D float weights on the way in (embeddings, norms and biases kept unless --select).")
@click.option("--spqr", type=float, default=None, metavar="OUTLIERS",
              help="SpQR overlay (4-bit base, this fraction of outliers) of 2-D float weights on the way in.")
@click.option("--partition", metavar="GRID", default=None,
              help="Split those weights into a grid of members, e.g. 2x2 (each quantized / SpQR'd if asked).")
@click.option("--select", "select", multiple=True, metavar="GLOB",
              help="Tensors --quantize / --spqr / --partition apply to (repeatable; default: 2-D float weights).")
@click.option("--verify", is_flag=True, help="Decode every output tensor and measure it against the input's values.")
@click.option("--memory", "memory", type=Bytes(), default=None,
              help="Converted bytes held in memory before the rest waits in a temporary file (default 1G).")
@click.option("--no-validate", "no_validate", is_flag=True,
              help="Write the file without the strict rules (a checkpoint whose chunks do not tile a tensor: "
                   "`audit` then names the partition rule).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def convert(source: str, destination: str, to: Optional[str], dequantize: bool, requantize: Optional[str],
            quantize: Optional[str], spqr: Optional[float], partition: Optional[str], select: tuple,
            verify: bool, memory: Optional[int], max_shard_size: Optional[int], ranks: Optional[int],
            quantized_as: Optional[str], no_validate: bool, as_json: bool) -> None:
    """Convert SOURCE (safetensors, GGUF, Hurray, a Hugging Face model folder or its
    model.safetensors.index.json, or a folder saved by torch.distributed.checkpoint) into
    DESTINATION (Hurray; from Hurray, safetensors, a model folder of shards and their index, or with
    --to dcp a folder torch.distributed.checkpoint.load reads).

    Prints a report per tensor: name, type in and out, bytes in and out, max absolute error and
    relative Frobenius error of the decoded values against the input's.  DESTINATION is replaced
    only once complete; on error nothing is written (exit code 2)."""
    from ..conversion import DEFAULT_MEMORY, convert as run

    with _convert_progress(source) as progress:
        try:
            report = run(source, destination, to=to, dequantize=dequantize, requantize=requantize,
                         quantize=quantize, spqr=spqr, partition=partition, select=select, verify=verify,
                         memory=DEFAULT_MEMORY if memory is None else memory, max_shard_size=max_shard_size,
                         progress=progress, validate=not no_validate, ranks=ranks, quantized_as=quantized_as)
        except (HurraySchemaError, OSError) as exc:
            fail(f"{source}: {exc}" if str(source) not in str(exc) else str(exc))
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else report.text())


@contextlib.contextmanager
def _convert_progress(source: str):
    """A progress callback drawing click's bar on stderr for a large input on a terminal, else None."""
    size = _input_bytes(source)
    if size < progress_threshold() or not sys.stderr.isatty():
        yield None
        return
    with click.progressbar(length=size, label="converting", file=sys.stderr) as bar:
        state = {"done": 0}

        def advance(done: int, total: int) -> None:
            bar.length = max(total, 1)
            bar.update(done - state["done"])
            state["done"] = done

        yield advance


def _input_bytes(source: str) -> int:
    """The size of the input: a file's, or the sum of the files at the top of an input folder."""
    if not os.path.isdir(source):
        return os.path.getsize(source)
    with os.scandir(source) as entries:
        return sum(entry.stat().st_size for entry in entries if entry.is_file())
