"""The timeline room: per rank, the step windows (`steps`), their exact partition into parts
(`partition`), the step kinds and the token steps (`kinds`), steps aligned to tokens across ranks
(`align`), the compute part split by kernel class (`compute_split`) and the breakdown of a run
(`breakdown`). Imports nothing of analyse's other rooms (docs/ARCHITECTURE.md)."""
