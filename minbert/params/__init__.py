"""params.yaml and its catalogues, in one direction: the schema with every key's help text
(minbert.params.schema; one-line messages in minbert.params.messages), then catalogue expansion
(grids, seeds: minbert.params.catalogue) and pure cross-section checks (minbert.params.validate),
then reading the files (minbert.params.load); on top, the settings each stage reads
(minbert.params.settings), the papers' tables against their text (minbert.params.papers) and the
generated docs key tables and editor schema (minbert.params.docs). Imports only minbert.core."""
from minbert.params.catalogue import LoadedParams, expand, grid_cells, seed_name, seeds_of
from minbert.params.load import catalogue_file, load_params, parse_params, read_yaml, validate_params
from minbert.params.messages import RENAMED
from minbert.params.schema import (
    CATALOGUE_SECTIONS,
    NAME_MAX,
    NAME_RE,
    PAPER_OVERALL,
    SEED_MAX,
    DataParams,
    DistillParams,
    Downsample,
    EnsembleParams,
    ExperimentParams,
    ExportParams,
    FinetuneParams,
    GridAxis,
    GridParams,
    HeadsParams,
    MlmParams,
    NliParams,
    PairHead,
    PaperClaim,
    PaperColumn,
    PaperMetric,
    PaperParams,
    PaperRow,
    Params,
    Pooling,
    PretrainParams,
    ReportParams,
    RetrainHeadsParams,
    Seed,
    SharedParams,
    SmartParams,
    Split,
    Strict,
    StudyPaper,
    StudyParams,
    Task,
    deep_merge,
    resolve_experiment,
)
from minbert.params.validate import (
    MULTI_TASK_UPDATES,
    check_params,
    model_tasks,
    shared_tasks,
    teacher_members,
)

__all__ = ['Task', 'PairHead', 'NAME_RE', 'NAME_MAX', 'SEED_MAX', 'Seed', 'Strict', 'DataParams', 'Downsample',
           'SharedParams', 'Pooling', 'HeadsParams', 'SmartParams', 'DistillParams', 'FinetuneParams',
           'RetrainHeadsParams', 'MlmParams', 'NliParams', 'PretrainParams', 'ExperimentParams', 'EnsembleParams',
           'GridAxis', 'GridParams', 'PAPER_OVERALL', 'PaperMetric', 'Split', 'PaperParams', 'PaperColumn',
           'PaperRow', 'PaperClaim', 'StudyPaper', 'StudyParams', 'ReportParams', 'ExportParams', 'Params',
           'deep_merge', 'RENAMED', 'resolve_experiment', 'read_yaml', 'load_params', 'parse_params',
           'CATALOGUE_SECTIONS', 'catalogue_file', 'seeds_of', 'seed_name', 'grid_cells', 'expand',
           'validate_params', 'check_params', 'MULTI_TASK_UPDATES', 'model_tasks', 'shared_tasks',
           'teacher_members', 'LoadedParams']
