"""Training data: byte-level text (text.py), Megatron's indexed dataset (indexed.py), the GPT dataset with
splits and blends (gpt.py), the batches of a step (source.py) and the data flags of train.py (args.py)."""

from hybrid.data.indexed import IndexedDataset, IndexedDatasetWriter, optimal_dtype
from hybrid.data.source import DataSource, Split, SplitSizes, open_dataset
from hybrid.data.text import BYTE_VOCAB, BatchSpec, global_batch, load_corpus, micro_batches, read_text

__all__ = ["BYTE_VOCAB", "BatchSpec", "DataSource", "IndexedDataset", "IndexedDatasetWriter", "Split", "SplitSizes",
           "global_batch", "load_corpus", "micro_batches", "open_dataset", "optimal_dtype", "read_text"]
