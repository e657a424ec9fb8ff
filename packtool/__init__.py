"""packtool: tokenize corpora, measure padding waste, pack sequences and write Parquet shards."""

from packtool.errors import ConfigError, DataError, MissingDependencyError, PacktoolError

__version__ = "0.1.0"

__all__ = ["ConfigError", "DataError", "MissingDependencyError", "PacktoolError", "__version__"]
