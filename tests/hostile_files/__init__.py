"""The hostile-files table: crafted model folders, checkpoints, indexes, caches, data files and planted paths."""
