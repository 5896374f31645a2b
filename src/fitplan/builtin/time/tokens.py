"""Tokens: the dataset's tokens, what one epoch processes (packed or padded), and the whole run.

``train_tokens = epoch_tokens × num_train_epochs``; padding to ``max_seq_length`` costs its pad tokens
(``padding_tokens``) and truncates longer examples (``truncated_tokens``). None without a dataset.
"""

from __future__ import annotations

from fitplan.engine.declarations import quantity
from fitplan.errors import FitplanError



@quantity("tokens", json_key="time.dataset_tokens")
def dataset_tokens(num_examples, tokens_per_example, total_tokens):
    """Real (unpadded) tokens in one pass over the dataset: ``total_tokens``, or ``num_examples ×
    tokens_per_example`` (the seed: 10,000 × 512 = 5,120,000). None without a dataset."""
    if total_tokens is not None:
        if num_examples is not None and tokens_per_example is not None:
            product = num_examples * tokens_per_example
            if abs(product - total_tokens) > 0.005 * total_tokens:
                raise FitplanError(
                    f"Dataset.total_tokens ({total_tokens:,}) disagrees with num_examples × tokens_per_example "
                    f"({num_examples:,} × {tokens_per_example:g} = {product:,.0f})", field="total_tokens", value=total_tokens,
                    suggestion="give two of --num-examples, --tokens-per-example and --total-tokens")
        return total_tokens
    if num_examples is None and tokens_per_example is None:
        return None
    if num_examples is None or tokens_per_example is None:
        given, missing = (("--num-examples", "--tokens-per-example") if tokens_per_example is None
                          else ("--tokens-per-example", "--num-examples"))
        raise FitplanError(f"{given} needs {missing} (or --total-tokens) to count the dataset's tokens",
                           field=missing.lstrip("-").replace("-", "_"), suggestion=f"add {missing} N")
    return num_examples * tokens_per_example


@quantity("tokens")
def epoch_tokens(dataset_tokens, num_examples, padding, max_seq_length):
    """Tokens the GPUs process per epoch. ``padding="pack"`` (default): the dataset's tokens, concatenated
    and cut into ``max_seq_length`` sequences. ``padding="pad"``: every example is padded (or truncated)
    to ``max_seq_length``, so it costs ``num_examples × max_seq_length`` whatever its length."""
    if dataset_tokens is None:
        return None
    if padding == "pad":
        if num_examples is None:
            raise FitplanError("--padding pad needs --num-examples: every example is padded to --max-seq-length",
                               field="num_examples", suggestion="add --num-examples N, or use --padding pack")
        return num_examples * max_seq_length
    return dataset_tokens


@quantity("tokens", json_key="time.tokens", short="tokens", label="training tokens")
def train_tokens(epoch_tokens, num_train_epochs):
    """Tokens processed by the whole run: tokens per epoch × ``num_train_epochs``
    (the seed: 5,120,000 × 3 = 15,360,000)."""
    return None if epoch_tokens is None else epoch_tokens * num_train_epochs


@quantity("tokens", json_key="time.padding_tokens")
def padding_tokens(epoch_tokens, dataset_tokens, num_train_epochs):
    """Pad tokens processed (and paid for) over the run: ``(epoch − real tokens) × epochs`` when padding
    to ``max_seq_length`` with a mean length below it; 0 when packing. A mean length, not the length
    distribution, is known: examples longer than ``max_seq_length`` are truncated (``truncated_tokens``)."""
    if epoch_tokens is None:
        return None
    return max(0.0, epoch_tokens - dataset_tokens) * num_train_epochs


@quantity("tokens", json_key="time.truncated_tokens")
def truncated_tokens(epoch_tokens, dataset_tokens, num_train_epochs):
    """Tokens cut off by padding/truncating to ``max_seq_length`` when the mean example is longer (0 when packing)."""
    if epoch_tokens is None:
        return None
    return max(0.0, dataset_tokens - epoch_tokens) * num_train_epochs


QUANTITIES = (dataset_tokens, epoch_tokens, train_tokens, padding_tokens, truncated_tokens)
