package worker

// Packing is how a micro-batch's rows are laid out for the forward pass:
// which packed sequence each row goes to, and the token positions computed
// with and without packing (the difference is the padding packing saves).
type Packing struct {
	// Seq is, per row, its packed sequence (rows of one sequence keep
	// their order).
	Seq []int32
	// Sequences is how many packed sequences there are; Positions is
	// Sequences x the longest one, the positions the forward pass computes.
	Sequences, Positions int
	// PaddedPositions is rows x the longest row: the positions without
	// packing.
	PaddedPositions int
}

// PackRows places rows of the given token lengths into sequences of at most
// budget tokens, in row order (a row starts a new sequence when it does not
// fit the current one; a row longer than budget gets one of its own), so
// the layout depends only on the batch (TRL's padding_free with a token
// budget). Each row still attends only to itself and keeps its positions.
func PackRows(lengths []int, budget int) Packing {
	p := Packing{Seq: make([]int32, len(lengths))}
	longestRow, longestSeq, fill := 0, 0, 0
	for i, n := range lengths {
		longestRow = max(longestRow, n)
		if p.Sequences == 0 || fill+n > budget {
			p.Sequences++
			fill = 0
		}
		p.Seq[i] = int32(p.Sequences - 1)
		fill += n
		longestSeq = max(longestSeq, fill)
	}
	p.Positions = p.Sequences * longestSeq
	p.PaddedPositions = len(lengths) * longestRow
	return p
}
