package sqlstore

import "strconv"

// limitClause is a statement's LIMIT, n written into its text: never a
// parameter. SQLite takes a LIMIT bound to a parameter for a constant of
// its plan and marks the statement expired whenever that parameter is
// bound, to the same value or another, so each run of the statement parsed
// and planned it anew (docs/benchmarks-notebook.md, "LIMIT in the
// statement's text"). An OFFSET is not planned with: it stays a parameter.
//
// Each n makes a statement text of its own, prepared and kept apart by
// stmtCache on SQLite and by pgx per connection on PostgreSQL, both bounded
// by count: n is a constant, a small count (a worker's free slots), or a
// bucket of pageLimit or batchLimit, never a number a request chose. A
// negative n, which no caller passes, is written as 0.
func limitClause(n int) string {
	return " LIMIT " + strconv.Itoa(max(n, 0))
}

// limitStep is the i-th of the LIMITs a page or a batch is read with: 1,
// 2 and 5 times the powers of ten, which hold the usual page sizes (the default
// 50, 10, 20, 100, the largest 1000), so a list's statement has at most
// ten texts for every size a client may ask.
func limitStep(i int) int {
	n := 1
	for ; i >= 3; i -= 3 {
		n *= 10
	}
	return n * [3]int{1, 2, 5}[i]
}

// pageLimit is the LIMIT a read of n rows is made with: the least step at
// or above n (0 for 0). The statement may return more than n rows; the
// caller keeps the first n (scanPage).
func pageLimit(n int) int {
	if n <= 0 {
		return 0
	}
	i := 0
	for limitStep(i) < n {
		i++
	}
	return limitStep(i)
}

// batchLimit is the LIMIT of a statement that must take at most n rows (a
// claim, a move): the greatest step at or below n (0 for 0). The caller
// takes the rest, if any, in a further statement.
func batchLimit(n int) int {
	if n <= 0 {
		return 0
	}
	i := 0
	for limitStep(i+1) <= n {
		i++
	}
	return limitStep(i)
}
