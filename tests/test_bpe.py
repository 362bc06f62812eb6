"""servelab.bpe: training, exact tiktoken parity, file formats, the course tokenizer."""

from servelab import bpe


def test_course_tokenizer_loads_and_round_trips():
    tok = bpe.load_course_tokenizer()
    assert tok.n_vocab == 4096
    assert [tok.special_tokens[s] for s in bpe.COURSE_SPECIAL_TOKENS] == list(range(4091, 4096))
    text = "def hello():\n    return 'héllo, 世界' + str(42)\n"
    assert tok.decode(tok.encode(text)) == text
