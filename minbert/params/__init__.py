"""params.yaml and its catalogues, in one direction: the schema with every key's help text
(minbert.params.fields, minbert.params.heads, minbert.params.finetune, minbert.params.schema; one-line messages in
minbert.params.messages), then catalogue expansion
(grids, seeds: minbert.params.catalogue) and pure cross-section checks (minbert.params.validate),
then reading the files (minbert.params.load); on top, the settings each stage reads
(minbert.params.settings), the papers' tables against their text (minbert.params.papers) and the
generated docs key tables and editor schema (minbert.params.docs). Imports only minbert.core.

The studies, the papers' tables and the whole file's model (`Params`) are imported from
minbert.params.studies itself and not from here: every job runs this package's `__init__`, and only
the report runs those."""

from minbert.params.catalogue import (
    LoadedParams,
    expand,
    grid_cells,
    seed_name,
    seeds_of,
)
from minbert.params.fields import NAME_MAX, NAME_RE, SEED_MAX, Downsample, Seed, Strict, TaskName
from minbert.params.finetune import (
    MULTI_TASK_UPDATES,
    DistillParams,
    FinetuneParams,
    RetrainHeadsParams,
    SmartParams,
)
from minbert.params.heads import HeadsParams, Pooling, SharedParams
from minbert.params.load import (
    catalogue_file,
    load_params,
    parse_params,
    read_yaml,
    validate_params,
)
from minbert.params.messages import RENAMED
from minbert.params.schema import (
    CATALOGUE_SECTIONS,
    DataParams,
    EnsembleParams,
    ExperimentParams,
    ExportParams,
    MlmParams,
    NliParams,
    PretrainParams,
    deep_merge,
    resolve_experiment,
)
from minbert.params.validate import (
    check_params,
    model_tasks,
    shared_tasks,
    teacher_members,
)

__all__ = [
    'CATALOGUE_SECTIONS',
    'MULTI_TASK_UPDATES',
    'NAME_MAX',
    'NAME_RE',
    'RENAMED',
    'SEED_MAX',
    'DataParams',
    'DistillParams',
    'Downsample',
    'EnsembleParams',
    'ExperimentParams',
    'ExportParams',
    'FinetuneParams',
    'HeadsParams',
    'LoadedParams',
    'MlmParams',
    'NliParams',
    'Pooling',
    'PretrainParams',
    'RetrainHeadsParams',
    'Seed',
    'SharedParams',
    'SmartParams',
    'Strict',
    'TaskName',
    'catalogue_file',
    'check_params',
    'deep_merge',
    'expand',
    'grid_cells',
    'load_params',
    'model_tasks',
    'parse_params',
    'read_yaml',
    'resolve_experiment',
    'seed_name',
    'seeds_of',
    'shared_tasks',
    'teacher_members',
    'validate_params',
]
