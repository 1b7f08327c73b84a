"""Old import path of the PostgreSQL refusal classes; their home is ``adapters.sinks.pg_errors``."""

from adapters.sinks.pg_errors import (
    REASONS,
    Refusal,
    classify,
    describe_columns_sql,
    one_line,
    relkind_sql,
    row_reason,
    shape_problems,
    translate,
    unique_id_sql,
)

__all__ = ["REASONS", "Refusal", "classify", "describe_columns_sql", "one_line", "relkind_sql",
           "row_reason", "shape_problems", "translate", "unique_id_sql"]
