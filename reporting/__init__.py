"""The report's drawing and table code, behind ``python -m scripts.report`` and the other ``report_*`` scripts: charts
(:mod:`reporting.figures`: plotly on the page, matplotlib as PNGs) and tables with their CSVs (:mod:`reporting.tables`).
What is computed (reading runs, grouping, statistics, the charts' data) lives in :mod:`analysis`; this package
only lays it out."""
