DROP TABLE recovered_answers;
