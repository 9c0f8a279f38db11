"""The pipeline's machinery: the jobs of a params file with their descriptions and code
closures (plan), per-job locks, and run records. Imports the layers below; the stages
(stages/) and the engines (workflow/) stand on it."""
