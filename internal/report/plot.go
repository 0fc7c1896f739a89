package report

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"sort"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Plot sizes and the bounds that keep a long run's page small.
const (
	plotWidth  = 7.5 * vg.Inch
	plotHeight = 3.2 * vg.Inch
	maxPoints  = 400  // per line; longer series are averaged in buckets
	maxBars    = 120  // per stacked chart
	markerMax  = 60   // draw point markers only on short series
	headroom   = 0.06 // of the y range, left free above the data
)

// renderSVG draws c as an SVG document (without the XML prolog, ready to
// inline into HTML). gonum's SVG backend escapes all text.
func renderSVG(c chart) ([]byte, error) {
	p := plot.New()
	useSlackText(p)
	p.Title.Text = c.Title
	p.X.Label.Text = "step"
	p.Y.Label.Text = c.YLabel
	// The legend is drawn in HTML under the plot (legendOf): inside the
	// SVG it would cover the lines and cut long metric names.
	p.X.Tick.Marker = distinctTicks{}
	p.Y.Tick.Marker = distinctTicks{}
	p.Add(plotter.NewGrid())
	var err error
	switch c.Kind {
	case chartStacked:
		err = addStacked(p, c.Series)
	default:
		err = addLines(p, c.Series)
	}
	if err != nil {
		return nil, fmt.Errorf("plot %s: %w", c.ID, err)
	}
	// Room on the right so the last tick label is not cut at the edge.
	p.X.Max += 0.03 * (p.X.Max - p.X.Min)
	if p.Y.Min == p.Y.Max {
		// A constant series (learning rate, a zero clip ratio): centre it
		// instead of gonum's ±1 that flattens small values onto 0.
		pad := math.Abs(p.Y.Min) * 0.1
		if pad == 0 {
			pad = 1
		}
		p.Y.Min, p.Y.Max = p.Y.Min-pad, p.Y.Max+pad
	} else {
		// Headroom: gonum ends the axis at the data's maximum, which put
		// the tallest bar and the highest line flush against the title.
		p.Y.Max += headroom * (p.Y.Max - p.Y.Min)
	}
	wt, err := p.WriterTo(plotWidth, plotHeight, "svg")
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", c.ID, err)
	}
	var buf bytes.Buffer
	if _, err := wt.WriteTo(&buf); err != nil {
		return nil, fmt.Errorf("render %s: %w", c.ID, err)
	}
	b := buf.Bytes()
	if i := bytes.Index(b, []byte("<svg")); i > 0 {
		b = b[i:]
	}
	return b, nil
}

func seriesColor(i int) color.Color { return plotutil.Color(i) }

func addLines(p *plot.Plot, ss []series) error {
	for i, s := range ss {
		s = finite(downsample(s, maxPoints))
		if len(s.X) == 0 {
			continue
		}
		col := seriesColor(i)
		if s.Std != nil {
			band, err := plotter.NewPolygon(stdBand(s))
			if err != nil {
				return fmt.Errorf("std band of %s: %w", s.Name, err)
			}
			r, g, b, _ := col.RGBA()
			band.Color = color.NRGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(b >> 8), A: 60}
			band.LineStyle.Width = 0
			p.Add(band)
		}
		xys := make(plotter.XYs, len(s.X))
		for j := range s.X {
			xys[j] = plotter.XY{X: s.X[j], Y: s.Y[j]}
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("line %s: %w", s.Name, err)
		}
		l.Color = col
		l.Width = vg.Points(1.5)
		p.Add(l)
		if len(xys) <= markerMax {
			sc, err := plotter.NewScatter(xys)
			if err != nil {
				return fmt.Errorf("points %s: %w", s.Name, err)
			}
			sc.Color = col
			sc.Shape = draw.CircleGlyph{}
			sc.Radius = vg.Points(2)
			p.Add(sc)
		}
	}
	return nil
}

// stdBand is the polygon from mean+std along x and back along mean-std.
func stdBand(s series) plotter.XYs {
	n := len(s.X)
	band := make(plotter.XYs, 0, 2*n)
	for i := range n {
		band = append(band, plotter.XY{X: s.X[i], Y: s.Y[i] + s.Std[i]})
	}
	for i := n - 1; i >= 0; i-- {
		band = append(band, plotter.XY{X: s.X[i], Y: s.Y[i] - s.Std[i]})
	}
	return band
}

// finite drops points where x, y or std is NaN or ±Inf (a step whose
// metric could not be computed); plotters reject them.
func finite(s series) series {
	out := series{Name: s.Name}
	if s.Std != nil {
		out.Std = []float64{}
	}
	ok := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	for i := range s.X {
		if !ok(s.X[i]) || !ok(s.Y[i]) || (s.Std != nil && !ok(s.Std[i])) {
			continue
		}
		out.X = append(out.X, s.X[i])
		out.Y = append(out.Y, s.Y[i])
		if s.Std != nil {
			out.Std = append(out.Std, s.Std[i])
		}
	}
	return out
}

// downsample averages s into at most n buckets of consecutive points.
func downsample(s series, n int) series {
	if len(s.X) <= n {
		return s
	}
	out := series{Name: s.Name}
	for b := range n {
		lo, hi := b*len(s.X)/n, (b+1)*len(s.X)/n
		out.X = append(out.X, mean(s.X[lo:hi]))
		out.Y = append(out.Y, mean(s.Y[lo:hi]))
		if s.Std != nil {
			out.Std = append(out.Std, mean(s.Std[lo:hi]))
		}
	}
	return out
}

func mean(v []float64) float64 {
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}

// addStacked draws the layers as bars stacked per step, in series order.
func addStacked(p *plot.Plot, ss []series) error {
	// One x axis for all layers: the union of their steps.
	xset := map[float64]bool{}
	for _, s := range ss {
		for _, x := range s.X {
			xset[x] = true
		}
	}
	xs := make([]float64, 0, len(xset))
	for x := range xset {
		xs = append(xs, x)
	}
	sort.Float64s(xs)
	layers := make([]series, len(ss))
	for i, s := range ss {
		l := series{Name: s.Name, X: xs, Y: make([]float64, len(xs))}
		for j, x := range xs {
			if v := valueAt(s, x); !math.IsNaN(v) && !math.IsInf(v, 0) {
				l.Y[j] = max(v, 0)
			}
		}
		layers[i] = downsample(l, maxBars)
	}
	if len(layers) == 0 || len(layers[0].X) == 0 {
		return nil
	}
	bars := &stackedBars{X: layers[0].X}
	for i, l := range layers {
		bars.Layers = append(bars.Layers, l.Y)
		bars.Colors = append(bars.Colors, seriesColor(i))
	}
	bars.Width = barWidth(bars.X)
	p.Add(bars)
	return nil
}

// barWidth is 80% of the smallest gap between steps (1 for a single step).
func barWidth(xs []float64) float64 {
	gap := math.Inf(1)
	for i := 1; i < len(xs); i++ {
		gap = math.Min(gap, xs[i]-xs[i-1])
	}
	if math.IsInf(gap, 1) || gap <= 0 {
		gap = 1
	}
	return 0.8 * gap
}

// stackedBars is a plot.Plotter drawing one bar per x with the layers
// stacked bottom-up; widths are in data units so uneven steps stay honest.
type stackedBars struct {
	X      []float64
	Layers [][]float64
	Colors []color.Color
	Width  float64
}

func (b *stackedBars) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	for i, x := range b.X {
		bottom := 0.0
		for l, layer := range b.Layers {
			top := bottom + layer[i]
			if top > bottom {
				x0, x1 := trX(x-b.Width/2), trX(x+b.Width/2)
				y0, y1 := trY(bottom), trY(top)
				rect := []vg.Point{{X: x0, Y: y0}, {X: x1, Y: y0}, {X: x1, Y: y1}, {X: x0, Y: y1}}
				c.FillPolygon(b.Colors[l], c.ClipPolygonXY(rect))
			}
			bottom = top
		}
	}
}

// DataRange covers every bar and starts the y axis at zero.
func (b *stackedBars) DataRange() (xmin, xmax, ymin, ymax float64) {
	xmin, xmax = math.Inf(1), math.Inf(-1)
	for i, x := range b.X {
		xmin, xmax = math.Min(xmin, x-b.Width/2), math.Max(xmax, x+b.Width/2)
		total := 0.0
		for _, layer := range b.Layers {
			total += layer[i]
		}
		ymax = math.Max(ymax, total)
	}
	if ymax == 0 {
		ymax = 1
	}
	return xmin, xmax, 0, ymax
}

// legendEntry is one series' name and colour for the HTML legend.
type legendEntry struct {
	Name  string
	Color string // #rrggbb
}

// legendOf lists c's series in drawing order with their colours.
func legendOf(c chart) []legendEntry {
	out := make([]legendEntry, len(c.Series))
	for i, s := range c.Series {
		r, g, b, _ := seriesColor(i).RGBA()
		out[i] = legendEntry{Name: s.Name, Color: fmt.Sprintf("#%02x%02x%02x", r>>8, g>>8, b>>8)}
	}
	return out
}

// distinctTicks are gonum's default ticks with plain decimal labels that
// are exact and distinct: gonum's own labels turn a narrow range like
// 5.7521…5.7523 into three "5.75"s, and 'g' formatting writes step 400 as
// "4e+02". Very large or very small magnitudes keep exponent notation.
type distinctTicks struct{}

func (distinctTicks) Ticks(min, max float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(min, max)
	var major []int
	maxAbs := 0.0
	for i, t := range ticks {
		if t.Label != "" {
			major = append(major, i)
			maxAbs = math.Max(maxAbs, math.Abs(t.Value))
		}
	}
	span := max - min
	if span <= 0 {
		span = math.Max(maxAbs, 1)
	}
	label := func(v float64, digits int) (string, bool) {
		if maxAbs >= 1e6 || maxAbs < 1e-4 && maxAbs != 0 {
			s := strconv.FormatFloat(v, 'g', digits+1, 64)
			back, _ := strconv.ParseFloat(s, 64)
			return s, math.Abs(back-v) <= 1e-6*span
		}
		p := math.Pow(10, float64(digits))
		r := math.Round(v*p) / p
		return strconv.FormatFloat(r, 'f', -1, 64), math.Abs(r-v) <= 1e-6*span
	}
	for digits := 0; digits <= 12; digits++ {
		seen := map[string]bool{}
		ok := true
		labels := make([]string, len(major))
		for j, i := range major {
			l, exact := label(ticks[i].Value, digits)
			if !exact || seen[l] {
				ok = false
				break
			}
			seen[l] = true
			labels[j] = l
		}
		if ok {
			for j, i := range major {
				ticks[i].Label = labels[j]
			}
			break
		}
	}
	return ticks
}
