package worker

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/ortrain/ortrain/internal/model"
)

// Under ZeRO stage 1/2 each rank keeps AdamW state only for its contiguous
// slice of the flattened trainable parameters and writes that slice to its
// own shard file. Rank 0 merges the shards into one file in the unsharded
// format (what SaveOptimizer writes), so a run can resume under any world
// size, sharded or not.
const (
	// optimizerFormat is the metadata "format" of an unsharded AdamW file.
	optimizerFormat = "ortrain-adamw"
	// optimizerShardFormat is the metadata "format" of one rank's shard.
	optimizerShardFormat = "ortrain-adamw-shard"
)

// The two AdamW moments, in the order the merged file lists them.
const (
	optimizerExpAvg   = "exp_avg"
	optimizerExpAvgSq = "exp_avg_sq"
)

var optimizerKinds = [2]string{optimizerExpAvg, optimizerExpAvgSq}

// optimizerParam is the prefix of a stage-3 shard's parameter pieces
// ("param.PARAM@OFF"): the rank's slice of the parameter itself, so a
// checkpoint's weights are merged from the files as its AdamW state is.
const optimizerParam = "param"

// optimizerStepName is the I64 [1] step counter, the same on every rank.
const optimizerStepName = "step"

// optimizerShardPiece parses a shard tensor name "KIND.PARAM@OFF" where KIND
// is exp_avg or exp_avg_sq. The offset is the decimal after the last '@',
// since parameter names may themselves contain '@' and dots. Only the
// canonical spelling of OFF (no sign, no leading zeros) is accepted, so a
// name parses to exactly one piece and optimizerShardPieceName rebuilds it.
func optimizerShardPiece(name string) (kind, param string, off int64, ok bool) {
	at := strings.LastIndexByte(name, '@')
	if at < 0 {
		return "", "", 0, false
	}
	digits := name[at+1:]
	if digits == "" || (len(digits) > 1 && digits[0] == '0') {
		return "", "", 0, false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return "", "", 0, false
		}
	}
	off, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return "", "", 0, false
	}
	head := name[:at]
	// exp_avg_sq first: "exp_avg." is the shorter prefix of the two names.
	switch {
	case strings.HasPrefix(head, optimizerExpAvgSq+"."):
		kind, param = optimizerExpAvgSq, head[len(optimizerExpAvgSq)+1:]
	case strings.HasPrefix(head, optimizerExpAvg+"."):
		kind, param = optimizerExpAvg, head[len(optimizerExpAvg)+1:]
	case strings.HasPrefix(head, optimizerParam+"."):
		kind, param = optimizerParam, head[len(optimizerParam)+1:]
	default:
		return "", "", 0, false
	}
	if param == "" {
		return "", "", 0, false
	}
	return kind, param, off, true
}

// optimizerShardPieceName names the piece of param's kind state that starts
// at flat element off: "KIND.PARAM@OFF".
func optimizerShardPieceName(kind, param string, off int64) string {
	return kind + "." + param + "@" + strconv.FormatInt(off, 10)
}

// shardPiece is one 1-D piece of a parameter's state in one shard file,
// holding flat elements [off, off+n).
type shardPiece struct {
	file string
	h    *model.SafetensorsHeader
	t    model.TensorInfo
	off  int64
	n    int64
}

func (p shardPiece) String() string {
	return fmt.Sprintf("%s in %s (elements [%d, %d))", p.t.Name, p.file, p.off, p.off+p.n)
}

// shardParam gathers the pieces of one trainable parameter.
type shardParam struct {
	info   TensorInfo
	numel  int64
	pieces [3][]shardPiece // indexed like optimizerKinds, then the parameter's own (stage 3)
}

func (s *shardParam) hasState() bool { return len(s.pieces[0])+len(s.pieces[1]) > 0 }

// MergeOptimizerShards merges the per-rank ZeRO optimizer shard files into
// one optimizer file at dst in the unsharded format SaveOptimizer writes, so
// resume does not depend on the world size. shards[i] must be rank i's file;
// params are the model's trainable tensors. Everything is validated from the
// headers before dst is written; the output is then streamed one piece at a
// time and appears atomically (temp file in dst's directory, then rename).
// A parameter with no pieces on any rank has no state and is left out.
func MergeOptimizerShards(dst string, shards []string, params []TensorInfo) error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("merge optimizer shards into %s: %w", dst, fmt.Errorf(format, args...))
	}
	_, order, step, err := indexShards(shards, params)
	if err != nil {
		return fail("%w", err)
	}
	// The writer lays tensors out in its canonical order, the same for
	// SaveOptimizer, so the merged file matches an unsharded one byte for byte.
	type source struct {
		p *shardParam
		k int
	}
	sources := map[string]source{}
	specs := []model.TensorSpec{{Name: optimizerStepName, DType: model.I64, Shape: []int64{1}}}
	for _, p := range order {
		if !p.hasState() {
			continue
		}
		if err := checkShardCoverage(p); err != nil {
			return fail("%w", err)
		}
		for k, kind := range optimizerKinds {
			name := kind + "." + p.info.Name
			sources[name] = source{p, k}
			specs = append(specs, model.TensorSpec{Name: name, DType: p.info.DType, Shape: p.info.Shape})
		}
	}
	var cp pieceCopier
	defer cp.close()
	err = model.WriteSafetensorsStream(dst, specs, map[string]string{"format": optimizerFormat}, func(s model.TensorSpec, w io.Writer) error {
		if s.Name == optimizerStepName {
			_, err := w.Write(step)
			return err
		}
		src := sources[s.Name]
		for _, piece := range src.p.pieces[src.k] {
			if err := cp.copy(w, piece); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("merge optimizer shards: %w", err)
	}
	return nil
}

// indexShards reads every shard file's header, checks its metadata and
// step, and indexes its pieces by parameter.
func indexShards(shards []string, params []TensorInfo) (map[string]*shardParam, []*shardParam, []byte, error) {
	fail := func(format string, args ...any) (map[string]*shardParam, []*shardParam, []byte, error) {
		return nil, nil, nil, fmt.Errorf(format, args...)
	}
	if len(shards) == 0 {
		return fail("no shard files")
	}
	byName, order, err := indexShardParams(params)
	if err != nil {
		return fail("%w", err)
	}
	var step []byte
	stepFile := ""
	rankFile := map[int]string{}
	for i, path := range shards {
		h, err := model.ReadSafetensorsHeader(path)
		if err != nil {
			return fail("%w", err)
		}
		if err := checkShardMetadata(h.Metadata, i, len(shards), rankFile, path); err != nil {
			return fail("%s: %w", path, err)
		}
		sawStep := false
		for _, t := range h.Tensors {
			if t.Name == optimizerStepName {
				s, err := readShardStep(path, h, t)
				if err != nil {
					return fail("%s: %w", path, err)
				}
				if step == nil {
					step, stepFile = s, path
				} else if string(s) != string(step) {
					return fail("step %d in %s differs from step %d in %s", stepValue(s), path, stepValue(step), stepFile)
				}
				sawStep = true
				continue
			}
			if err := addShardPiece(byName, path, h, t); err != nil {
				return fail("%s: %w", path, err)
			}
		}
		if !sawStep {
			return fail("%s: no %q tensor", path, optimizerStepName)
		}
	}
	return byName, order, step, nil
}

// shardedParams reads a stage-3 run's parameters from every rank's shard
// file (their "param." pieces), one tensor at a time: the checkpoint's
// weights without a collective and without the whole model in memory.
type shardedParams struct {
	byName map[string]*shardParam
	cp     pieceCopier
}

func openShardedParams(shards []string, params []TensorInfo) (*shardedParams, error) {
	byName, _, _, err := indexShards(shards, params)
	if err != nil {
		return nil, err
	}
	return &shardedParams{byName: byName}, nil
}

// read returns the whole tensor name (the name of another parameter whose
// pieces hold it, for an alias such as a tied LM head).
func (s *shardedParams) read(name, holder string) ([]byte, error) {
	p := s.byName[holder]
	if p == nil {
		return nil, fmt.Errorf("%s: no such parameter in the shards", holder)
	}
	if len(p.pieces[2]) == 0 {
		return nil, fmt.Errorf("%s: the shard files hold no %s pieces of it (written by a stage-3 group?)", name, optimizerParam)
	}
	if err := checkPieceTiling(p, 2, optimizerParam); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	buf.Grow(int(p.numel) * p.info.DType.Size())
	for _, piece := range p.pieces[2] {
		if err := s.cp.copy(&buf, piece); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}

func (s *shardedParams) close() { s.cp.close() }

// indexShardParams checks the trainable tensors and indexes them by name,
// keeping their order for the output.
func indexShardParams(params []TensorInfo) (map[string]*shardParam, []*shardParam, error) {
	byName := make(map[string]*shardParam, len(params))
	order := make([]*shardParam, 0, len(params))
	for _, info := range params {
		if info.Name == "" || byName[info.Name] != nil {
			return nil, nil, fmt.Errorf("parameter name %q is empty or repeated", info.Name)
		}
		if info.DType.Size() == 0 {
			return nil, nil, fmt.Errorf("parameter %q: unknown dtype %q", info.Name, info.DType)
		}
		numel := uint64(1)
		for _, d := range info.Shape {
			hi, lo := bits.Mul64(numel, uint64(d))
			if d < 0 || hi != 0 || lo > math.MaxInt64 {
				return nil, nil, fmt.Errorf("parameter %q: bad shape %v", info.Name, info.Shape)
			}
			numel = lo
		}
		p := &shardParam{info: info, numel: int64(numel)}
		byName[info.Name] = p
		order = append(order, p)
	}
	return byName, order, nil
}

// checkShardMetadata checks the format, that the file is rank want of a
// world of world ranks, and that no other file claimed the same rank.
func checkShardMetadata(meta map[string]string, want, world int, rankFile map[int]string, path string) error {
	if meta["format"] != optimizerShardFormat {
		return fmt.Errorf("metadata format is %q, want %q", meta["format"], optimizerShardFormat)
	}
	ws, err := strconv.Atoi(meta["world_size"])
	if err != nil {
		return fmt.Errorf("metadata world_size %q is missing or not an integer", meta["world_size"])
	}
	if ws != world {
		return fmt.Errorf("metadata world_size is %d but %d shard files were given", ws, world)
	}
	rank, err := strconv.Atoi(meta["rank"])
	if err != nil {
		return fmt.Errorf("metadata rank %q is missing or not an integer", meta["rank"])
	}
	if rank < 0 || rank >= world {
		return fmt.Errorf("metadata rank %d is outside [0, %d)", rank, world)
	}
	if other, dup := rankFile[rank]; dup {
		return fmt.Errorf("duplicate rank %d, also held by %s", rank, other)
	}
	rankFile[rank] = path
	if rank != want {
		return fmt.Errorf("holds rank %d but is shard file %d (shard files must be in rank order)", rank, want)
	}
	return nil
}

// readShardStep reads and checks one shard's I64 [1] step tensor.
func readShardStep(path string, h *model.SafetensorsHeader, t model.TensorInfo) ([]byte, error) {
	if t.DType != model.I64 || len(t.Shape) != 1 || t.Shape[0] != 1 {
		return nil, fmt.Errorf("%q is %s%v, want I64[1]", t.Name, t.DType, t.Shape)
	}
	return model.ReadTensorData(path, h, t)
}

func stepValue(b []byte) int64 { return int64(binary.LittleEndian.Uint64(b)) }

// addShardPiece validates one non-step tensor of a shard against its
// parameter and records it.
func addShardPiece(byName map[string]*shardParam, path string, h *model.SafetensorsHeader, t model.TensorInfo) error {
	kind, param, off, ok := optimizerShardPiece(t.Name)
	if !ok {
		return fmt.Errorf("tensor %q is neither %q nor an optimizer state piece KIND.PARAM@OFFSET", t.Name, optimizerStepName)
	}
	p := byName[param]
	if p == nil {
		return fmt.Errorf("piece %q: unknown parameter %q", t.Name, param)
	}
	if t.DType != p.info.DType {
		return fmt.Errorf("piece %q: dtype %s differs from parameter %q dtype %s", t.Name, t.DType, param, p.info.DType)
	}
	if len(t.Shape) != 1 {
		return fmt.Errorf("piece %q: shape %v is not 1-D", t.Name, t.Shape)
	}
	n := t.Shape[0]
	if off > p.numel || n > p.numel-off {
		return fmt.Errorf("piece %q: elements [%d, %d) run past the %d elements of parameter %q", t.Name, off, off+n, p.numel, param)
	}
	k := 0
	switch kind {
	case optimizerExpAvgSq:
		k = 1
	case optimizerParam:
		k = 2
	}
	p.pieces[k] = append(p.pieces[k], shardPiece{file: path, h: h, t: t, off: off, n: n})
	return nil
}

// checkShardCoverage sorts a parameter's pieces by offset and checks that
// each moment is present and tiled by them exactly: no overlap, no gap.
func checkShardCoverage(p *shardParam) error {
	for k, kind := range optimizerKinds {
		if len(p.pieces[k]) == 0 {
			return fmt.Errorf("parameter %q has %s pieces but no %s pieces", p.info.Name, optimizerKinds[1-k], kind)
		}
		if err := checkPieceTiling(p, k, kind); err != nil {
			return err
		}
	}
	return nil
}

// checkPieceTiling sorts a parameter's pieces of kind k by offset and
// checks that they tile it exactly: no overlap, no gap.
func checkPieceTiling(p *shardParam, k int, kind string) error {
	pieces := p.pieces[k]
	sort.SliceStable(pieces, func(i, j int) bool {
		return pieces[i].off < pieces[j].off || (pieces[i].off == pieces[j].off && pieces[i].n < pieces[j].n)
	})
	next := int64(0)
	var last shardPiece
	for _, piece := range pieces {
		if piece.n == 0 {
			continue // holds nothing, overlaps nothing
		}
		if piece.off < next {
			return fmt.Errorf("parameter %q: %s pieces overlap: %s and %s", p.info.Name, kind, last, piece)
		}
		if piece.off > next {
			return fmt.Errorf("parameter %q: %s is missing elements [%d, %d) of %d", p.info.Name, kind, next, piece.off, p.numel)
		}
		next, last = piece.off+piece.n, piece
	}
	if next < p.numel {
		return fmt.Errorf("parameter %q: %s is missing elements [%d, %d) of %d", p.info.Name, kind, next, p.numel, p.numel)
	}
	return nil
}

// pieceCopier streams pieces' bytes from their shard files, keeping one file
// open at a time so the merge holds no tensor in memory and few descriptors.
type pieceCopier struct {
	path string
	f    *os.File
}

func (c *pieceCopier) copy(w io.Writer, p shardPiece) error {
	if c.f == nil || c.path != p.file {
		c.close()
		f, err := os.Open(p.file)
		if err != nil {
			return fmt.Errorf("open shard: %w", err)
		}
		c.f, c.path = f, p.file
	}
	n := p.t.End - p.t.Begin
	if _, err := io.CopyN(w, io.NewSectionReader(c.f, p.h.DataStart+p.t.Begin, n), n); err != nil {
		return fmt.Errorf("copy %s: %w", p, err)
	}
	return nil
}

func (c *pieceCopier) close() {
	if c.f != nil {
		c.f.Close()
		c.f, c.path = nil, ""
	}
}
