"""Reading for operators: rows, pages, workers, counts and the backlog (``listing``), and
what ``app.explain`` needs about one row (``explain``)."""
