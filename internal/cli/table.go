package cli

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// tablePrinter prints rows as an aligned, truncated table on a terminal and
// as tab-separated values otherwise (cli/cli's tableprinter convention).
type tablePrinter struct {
	w        io.Writer
	tty      bool
	maxWidth int // per column, terminal only
	rows     [][]string
}

func newTablePrinter(w io.Writer, tty bool) *tablePrinter {
	return &tablePrinter{w: w, tty: tty, maxWidth: 60}
}

// AddRow appends one row; the first row is the header.
func (t *tablePrinter) AddRow(cells ...string) { t.rows = append(t.rows, cells) }

// Render writes every row.
func (t *tablePrinter) Render() error {
	if !t.tty {
		for _, row := range t.rows {
			clean := make([]string, len(row))
			for i, c := range row {
				clean[i] = strings.NewReplacer("\t", " ", "\n", " ", "\r", " ").Replace(c)
			}
			if _, err := fmt.Fprintln(t.w, strings.Join(clean, "\t")); err != nil {
				return err
			}
		}
		return nil
	}
	var widths []int
	cells := make([][]string, len(t.rows))
	for r, row := range t.rows {
		cells[r] = make([]string, len(row))
		for i, c := range row {
			c = truncate(strings.NewReplacer("\n", " ", "\r", " ", "\t", " ").Replace(c), t.maxWidth)
			cells[r][i] = c
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	for _, row := range cells {
		var b strings.Builder
		for i, c := range row {
			b.WriteString(c)
			if i < len(row)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c)+2))
			}
		}
		if _, err := fmt.Fprintln(t.w, strings.TrimRight(b.String(), " ")); err != nil {
			return err
		}
	}
	return nil
}

func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-3]) + "..."
}
