// Command promparse reads a Prometheus text exposition (format 0.0.4) with Prometheus' own parser, the text parser
// of github.com/prometheus/common/expfmt (what `promtool check metrics` uses), and says whether it accepts it.
//
//	promparse < exposition.txt        exit 0 and a summary when accepted; exit 1 and the parser's error otherwise
//	promparse -serve                  many expositions on one process: each one read as "<length in bytes>\n<text>",
//	                                  answered with one line, "ok ..." or "error: ..." (the tests' fuzzing asks it
//	                                  hundreds of times: a process each would cost more than the parse)
//
// Beyond the parser, a series (a family's name and label set) written twice is refused: Prometheus keeps the first
// and counts the rest as duplicates, so the exposition is wrong even though it parses.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func check(text []byte) (string, error) {
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return "", err
	}
	samples := 0
	for name, family := range families {
		seen := map[string]bool{}
		for _, metric := range family.GetMetric() {
			key := series(metric)
			if seen[key] {
				return "", fmt.Errorf("family %s: the series {%s} is written twice", name, key)
			}
			seen[key] = true
			samples++
		}
	}
	return fmt.Sprintf("%d families, %d series", len(families), samples), nil
}

// series is a metric's label set, sorted, as one string.
func series(metric *dto.Metric) string {
	pairs := make([]string, 0, len(metric.GetLabel()))
	for _, label := range metric.GetLabel() {
		pairs = append(pairs, label.GetName()+"="+strconv.Quote(label.GetValue()))
	}
	sort.Strings(pairs)
	return strings.Join(pairs, ",")
}

func serve(in *bufio.Reader, out *bufio.Writer) error {
	for {
		line, err := in.ReadString('\n')
		if errors.Is(err, io.EOF) && line == "" {
			return nil
		}
		if err != nil {
			return err
		}
		size, err := strconv.Atoi(strings.TrimSpace(line))
		if err != nil || size < 0 {
			return fmt.Errorf("expected a length, got %q", line)
		}
		text := make([]byte, size)
		if _, err := io.ReadFull(in, text); err != nil {
			return err
		}
		summary, err := check(text)
		if err != nil {
			fmt.Fprintf(out, "error: %s\n", strings.ReplaceAll(err.Error(), "\n", `\n`))
		} else {
			fmt.Fprintf(out, "ok %s\n", summary)
		}
		if err := out.Flush(); err != nil {
			return err
		}
	}
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-serve" {
		if err := serve(bufio.NewReader(os.Stdin), bufio.NewWriter(os.Stdout)); err != nil {
			fmt.Fprintln(os.Stderr, "promparse:", err)
			os.Exit(2)
		}
		return
	}
	text, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "promparse:", err)
		os.Exit(2)
	}
	summary, err := check(text)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(summary)
}
