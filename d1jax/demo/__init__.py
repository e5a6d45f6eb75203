"""The CPU demo: d1's recipe (base -> SFT -> diffu-GRPO) in miniature on 4x4 Sudoku."""
